package jobs

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// maxMutualFiles is how many of the package's files may take part in a
// mutual pair: file A using a package-level name of file B while B uses one
// of A. Such a pair is one concept cut in two, or two concepts tangled, and
// a reader of either file must read the other. The number may only fall;
// lower it when a change makes it fall.
const maxMutualFiles = 0

// TestFilesLeanOneWay counts the package's files that take part in a mutual
// pair and fails when the count grows past maxMutualFiles, logging the pairs.
// A use counts toward the file that declares the name: a function, type,
// variable or constant, or a method (its own file, not its receiver's).
func TestFilesLeanOneWay(t *testing.T) {
	t.Parallel()
	pairs := mutualPairs(t)
	files := map[string]bool{}
	for _, p := range pairs {
		files[p[0]], files[p[1]] = true, true
		t.Logf("%s <-> %s", p[0], p[1])
	}
	t.Logf("%d files in %d mutual pairs", len(files), len(pairs))
	require.LessOrEqual(t, len(files), maxMutualFiles,
		"more files of package jobs use each other's names: move the name both need to a file of its own, or where it belongs")
}

// mutualPairs type-checks the package's non-test files against the export
// data the go command builds for its imports, and returns every pair of
// files that use each other's package-level names, by base name.
func mutualPairs(t *testing.T) [][2]string {
	t.Helper()
	goFiles, exports := listPackage(t)

	fset := token.NewFileSet()
	var parsed []*ast.File
	for _, name := range goFiles {
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		require.NoError(t, err)
		parsed = append(parsed, f)
	}
	lookup := func(path string) (io.ReadCloser, error) {
		export, ok := exports[path]
		if !ok {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(export)
	}
	conf := types.Config{Importer: importer.ForCompiler(fset, "gc", lookup)}
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}}
	pkg, err := conf.Check("github.com/heraldpush/herald/jobs", fset, parsed, info)
	require.NoError(t, err)

	uses := map[[2]string]bool{}
	for id, obj := range info.Uses {
		if obj.Pkg() != pkg || !declaredAtPackageLevel(obj) {
			continue
		}
		from := filepath.Base(fset.File(id.Pos()).Name())
		to := filepath.Base(fset.File(obj.Pos()).Name())
		if from != to {
			uses[[2]string{from, to}] = true
		}
	}
	var pairs [][2]string
	for u := range uses {
		if u[0] < u[1] && uses[[2]string{u[1], u[0]}] {
			pairs = append(pairs, u)
		}
	}
	slices.SortFunc(pairs, func(a, b [2]string) int { return strings.Compare(a[0]+" "+a[1], b[0]+" "+b[1]) })
	return pairs
}

// declaredAtPackageLevel reports whether obj is a package-level function,
// type, variable or constant, or a method: what a file declares for the
// others. Fields, parameters and locals belong to their declaration.
func declaredAtPackageLevel(obj types.Object) bool {
	if f, ok := obj.(*types.Func); ok && f.Signature().Recv() != nil {
		return true
	}
	return obj.Parent() == obj.Pkg().Scope()
}

// listPackage returns the package's non-test files, as paths, and the
// export data of everything it imports, by import path, as the go command
// lists and builds them.
func listPackage(t *testing.T) (goFiles []string, exports map[string]string) {
	t.Helper()
	out, err := exec.Command("go", "list", "-f", `{{range .GoFiles}}{{$.Dir}}/{{.}}{{"\n"}}{{end}}`, ".").Output()
	require.NoError(t, err, "go list: %s", stderrOf(err))
	goFiles = strings.Fields(string(out))

	out, err = exec.Command("go", "list", "-export", "-deps", "-f", "{{.ImportPath}} {{.Export}}", ".").Output()
	require.NoError(t, err, "go list -export: %s", stderrOf(err))
	exports = map[string]string{}
	s := bufio.NewScanner(bytes.NewReader(out))
	for s.Scan() {
		if path, export, ok := strings.Cut(s.Text(), " "); ok && export != "" {
			exports[path] = export
		}
	}
	return goFiles, exports
}

// stderrOf is what the go command said when it failed.
func stderrOf(err error) string {
	if exit := (*exec.ExitError)(nil); errors.As(err, &exit) {
		return string(exit.Stderr)
	}
	return ""
}
