package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/require"
)

// repoRoot is the repository's root, seen from this package's directory,
// where go test runs.
const repoRoot = "../.."

// maxREADMELines keeps the README a front page: the manual is in docs/.
const maxREADMELines = 300

// docFiles returns the project's docs, relative to the repository's root:
// README.md and every docs/*.md.
func docFiles(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	require.NoError(t, err)
	require.NotEmpty(t, docs, "no docs/*.md")
	files := []string{"README.md"}
	for _, d := range docs {
		rel, err := filepath.Rel(repoRoot, d)
		require.NoError(t, err)
		files = append(files, filepath.ToSlash(rel))
	}
	return files
}

// readDoc returns the doc at path, relative to the repository's root.
func readDoc(t *testing.T, path string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot, path))
	require.NoError(t, err)
	return string(raw)
}

// isFence reports whether line opens or closes a fenced code block.
func isFence(line string) bool {
	return strings.HasPrefix(strings.TrimSpace(line), "```")
}

// shellBlocks returns the contents of the doc's shell blocks (```sh), in
// order.
func shellBlocks(t *testing.T, path string) []string {
	t.Helper()
	var blocks []string
	var block strings.Builder
	in, shell := false, false
	for line := range strings.Lines(readDoc(t, path)) {
		switch {
		case !in && isFence(line):
			in, shell = true, strings.TrimSpace(line) == "```sh"
		case in && isFence(line):
			if shell {
				blocks = append(blocks, block.String())
				block.Reset()
			}
			in = false
		case in && shell:
			block.WriteString(line)
		}
	}
	require.False(t, in, "%s: a code block is not closed", path)
	return blocks
}

// proseLines returns the doc's lines outside fenced code blocks, with the
// 1-based number of each.
func proseLines(doc string) (lines []string, numbers []int) {
	in := false
	for i, line := range strings.Split(doc, "\n") {
		if isFence(line) {
			in = !in
			continue
		}
		if !in {
			lines = append(lines, line)
			numbers = append(numbers, i+1)
		}
	}
	return lines, numbers
}

var (
	codeSpan     = regexp.MustCompile("`[^`]*`")
	markdownLink = regexp.MustCompile(`\[([^\]]*)\]\(([^)\s]*)\)`)
)

// headingAnchors returns the anchors of the doc's headings as GitHub makes
// them: the heading's text lower-cased, without its markup and punctuation,
// spaces made hyphens, and -1, -2, ... after a repeated one.
func headingAnchors(doc string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	lines, _ := proseLines(doc)
	for _, line := range lines {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		text := strings.TrimSpace(strings.TrimLeft(line, "#"))
		text = markdownLink.ReplaceAllString(text, "$1")
		var slug strings.Builder
		for _, r := range strings.ToLower(text) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
				slug.WriteRune(r)
			case r == ' ':
				slug.WriteRune('-')
			}
		}
		anchor := slug.String()
		if n := seen[anchor]; n > 0 {
			seen[anchor]++
			anchor += "-" + strconv.Itoa(n)
		} else {
			seen[anchor] = 1
		}
		anchors[anchor] = true
	}
	return anchors
}

// TestHeadingAnchors pins the anchor rules TestDocLinks relies on.
func TestHeadingAnchors(t *testing.T) {
	t.Parallel()
	doc := "# Herald\n\n## The dispatch second: `make bench`\n\n```sh\n# not a heading\n```\n" +
		"## PostgreSQL's share\n## Many messages at one instant: `--messages`\n" +
		"## [Linked](x.md) title\n## Twice\n## Twice\n"
	anchors := headingAnchors(doc)
	for _, want := range []string{"herald", "the-dispatch-second-make-bench", "postgresqls-share",
		"many-messages-at-one-instant---messages", "linked-title", "twice", "twice-1"} {
		require.True(t, anchors[want], "no anchor %q in %v", want, anchors)
	}
	require.False(t, anchors["not-a-heading"], "a comment in a code block made an anchor")
}

// TestDocLinks checks that every relative link of README.md and docs/*.md
// points to a file of the repository and, with a #fragment into a doc, to
// one of its headings; that the README links to every doc; and that the
// README stays a front page.
func TestDocLinks(t *testing.T) {
	t.Parallel()
	docs := docFiles(t)
	anchors := map[string]map[string]bool{}
	for _, doc := range docs {
		anchors[doc] = headingAnchors(readDoc(t, doc))
	}
	linked := map[string]bool{}
	for _, doc := range docs {
		lines, numbers := proseLines(readDoc(t, doc))
		for i, line := range lines {
			where := doc + ":" + strconv.Itoa(numbers[i])
			for _, m := range markdownLink.FindAllStringSubmatch(codeSpan.ReplaceAllString(line, ""), -1) {
				target := m[2]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				path, fragment, _ := strings.Cut(target, "#")
				require.False(t, path == "" && fragment == "", "%s: an empty link", where)
				resolved := doc
				if path != "" {
					resolved = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(doc), path)))
					require.False(t, resolved == ".." || strings.HasPrefix(resolved, "../"),
						"%s: %s leaves the repository", where, target)
					_, err := os.Stat(filepath.Join(repoRoot, resolved))
					require.NoError(t, err, "%s: %s points to a missing file", where, target)
				}
				if doc == "README.md" {
					linked[resolved] = true
				}
				if fragment == "" {
					continue
				}
				headings, ok := anchors[resolved]
				require.True(t, ok, "%s: %s has a #fragment but is not a doc", where, target)
				require.True(t, headings[fragment], "%s: %s has no heading #%s", where, resolved, fragment)
			}
		}
	}
	for _, doc := range docs[1:] {
		require.True(t, linked[doc], "README.md does not link to %s", doc)
	}
	readme := readDoc(t, "README.md")
	require.LessOrEqual(t, strings.Count(readme, "\n"), maxREADMELines,
		"README.md is a front page: the rest belongs in docs/")
}

// TestDocShellBlocksAreRun checks that every shell block (```sh) of the docs
// is one the walkthrough runs: only the docs of walkthroughDocs hold them,
// and each of those holds some. A command that is shown but not run goes in
// an indented block.
func TestDocShellBlocksAreRun(t *testing.T) {
	t.Parallel()
	docs := docFiles(t)
	for _, doc := range walkthroughDocs {
		require.True(t, slices.Contains(docs, doc), "%s of walkthroughDocs is not a doc", doc)
		require.NotEmpty(t, shellBlocks(t, doc), "%s has no shell block to run", doc)
	}
	for _, doc := range docs {
		if !slices.Contains(walkthroughDocs, doc) {
			require.Empty(t, shellBlocks(t, doc), "%s has a shell block that no test runs", doc)
		}
	}
}
