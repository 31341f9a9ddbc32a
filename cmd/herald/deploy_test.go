package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/heraldpush/herald/api"
)

// TestDeployNamesExist holds deploy/ (the image, the Kubernetes manifests,
// the systemd units, the compose file) to what Herald is: every variable
// they set is one the command they run reads, every subcommand and flag
// exists, and every probe asks the path Herald serves for it, on a port
// the container names. A renamed variable or flag fails here, not in a
// cluster.
func TestDeployNamesExist(t *testing.T) {
	t.Parallel()
	got, problems := checkDeploy(os.DirFS("../../deploy"))
	require.Empty(t, problems)
	// What was read, so that a parser that stopped finding anything fails.
	for _, f := range []string{"image/Containerfile", "kubernetes/base/api.yaml", "kubernetes/base/worker.yaml",
		"kubernetes/base/urgent-worker.yaml", "kubernetes/base/migrate.yaml", "kubernetes/base/config.env",
		"systemd/herald.service", "systemd/herald-worker.service", "systemd/herald-migrate.service", "compose/compose.yaml"} {
		require.Contains(t, got.files, f, "deploy/%s named nothing of Herald's", f)
	}
	require.Subset(t, got.commands, []string{"serve --role api", "serve --role worker", "migrate", "fakepush --addr 0.0.0.0:8443 --sandbox-addr 0.0.0.0:8444 --hostname fakepush --tls-dir /var/lib/herald/fakepush"})
	require.Subset(t, got.env, []string{"DATABASE_URL_FILE", "HERALD_API_KEYS_FILE", "HERALD_ADMIN_PASSWORD_FILE", "HERALD_LANES", "HERALD_ADMIN_ADDR", "HERALD_SHUTDOWN_TIMEOUT"})
	require.GreaterOrEqual(t, got.probes, 6, "three Deployments, two probes each")
}

// TestDeployCheckFindsUnknownNames shows checkDeploy failing on each kind
// of name it checks.
func TestDeployCheckFindsUnknownNames(t *testing.T) {
	t.Parallel()
	fsys := fstest.MapFS{
		"k8s.yaml": {Data: []byte(`
apiVersion: apps/v1
kind: Deployment
spec:
  template:
    spec:
      containers:
        - name: herald
          image: registry.example.com/herald:v1
          args: [serve, --role, api, --rolle=api]
          ports: [{name: http, containerPort: 8080}]
          env:
            - name: HERALD_ADDR
              value: ":8080"
            - name: HERALD_NO_SUCH_SETTING
              value: "1"
          livenessProbe: {httpGet: {path: /health, port: http}}
          readinessProbe: {httpGet: {path: /readyz, port: web}}
        - name: db
          image: postgres:15
          env: [{name: POSTGRES_PASSWORD, value: x}]
      initContainers:
        - name: migrate
          image: herald
          args: [migrate]
          env: [{name: HERALD_LANES, value: bulk}]
`)},
		"unit.service": {Data: []byte("[Service]\nExecStart=/usr/bin/herald serve\nEnvironment=HERALD_ADDR=:1 HERALD_TYPO=1\n")},
		"typo.service": {Data: []byte("[Service]\nExecStart=/usr/bin/herald serev\n")},
		"compose.yaml": {Data: []byte(`
services:
  herald:
    build: {context: .}
    command: [serve, extra]
    environment: {DATABASE_URL: x, HERALD_API_KEY: y}
`)},
		"settings.env": {Data: []byte("HERALD_LOG_FORMAT=json\n# HERALD_COMMENTED_TYPO=1\n")},
	}
	_, problems := checkDeploy(fsys)
	joined := strings.Join(problems, "\n")
	for _, want := range []string{
		"k8s.yaml: serve does not read HERALD_NO_SUCH_SETTING",
		"k8s.yaml: herald serve has no flag --rolle",
		"k8s.yaml: liveness probe asks /health",
		"k8s.yaml: readiness probe's port web",
		"k8s.yaml: migrate does not read HERALD_LANES",
		"typo.service: no herald subcommand serev",
		"unit.service: serve does not read HERALD_TYPO",
		"compose.yaml: serve does not read HERALD_API_KEY",
		"compose.yaml: herald serve takes no argument extra",
		"settings.env: Herald does not read HERALD_COMMENTED_TYPO",
	} {
		require.Contains(t, joined, want)
	}
	require.NotContains(t, joined, "POSTGRES_PASSWORD", "another image's variables are not Herald's")
	require.Len(t, problems, 10, "%s", joined)
}

// deployNames is what checkDeploy found.
type deployNames struct {
	files    []string
	env      []string
	commands []string
	probes   int
}

// checkDeploy reads every file of fsys and returns what it names of Herald
// and what of that Herald does not have.
func checkDeploy(fsys fs.FS) (deployNames, []string) {
	c := deployCheck{helps: map[string]string{}}
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		before := len(c.env) + len(c.commands) + c.probes
		switch base := path.Base(p); {
		case strings.HasSuffix(base, ".yaml"), strings.HasSuffix(base, ".yml"):
			c.yamlFile(p, b)
		case strings.HasSuffix(base, ".service"):
			c.unitFile(p, b)
		case strings.HasSuffix(base, ".env"), strings.HasSuffix(base, ".env.example"):
			c.envFile(p, b)
		case base == "Containerfile" || base == "Dockerfile":
			c.containerfile(p, b)
		}
		if len(c.env)+len(c.commands)+c.probes > before {
			c.files = append(c.files, p)
		}
		return nil
	})
	if err != nil {
		c.problems = append(c.problems, err.Error())
	}
	return c.deployNames, c.problems
}

type deployCheck struct {
	deployNames
	problems []string
	// helps caches each subcommand's --help.
	helps map[string]string
}

func (c *deployCheck) problem(file, format string, args ...any) {
	c.problems = append(c.problems, file+": "+fmt.Sprintf(format, args...))
}

// commandEnv is the environment a subcommand reads; "" is any of them
// (a file of settings shared by several).
func commandEnv(sub string) []envVar {
	switch sub {
	case "serve":
		return serveEnv
	case "migrate":
		return migrateEnv
	case "":
		return append(slices.Clone(serveEnv), migrateEnv...)
	}
	return nil
}

// checkEnv checks that sub reads name.
func (c *deployCheck) checkEnv(file, sub, name string) {
	c.env = append(c.env, name)
	if !slices.ContainsFunc(commandEnv(sub), func(v envVar) bool { return v.name == name }) {
		if sub == "" {
			c.problem(file, "Herald does not read %s", name)
		} else {
			c.problem(file, "%s does not read %s", sub, name)
		}
	}
}

// flagLine is a flag in --help's output, and the word naming its value's
// type if it takes one.
var flagLine = regexp.MustCompile(`(?m)^  -(\S+)(?: (\S+))?`)

// checkCommand checks herald's args (what follows the binary): the
// subcommand exists and takes each flag. It returns the subcommand.
func (c *deployCheck) checkCommand(file string, args []string) string {
	if len(args) == 0 {
		return ""
	}
	c.commands = append(c.commands, strings.Join(args, " "))
	sub := args[0]
	help, ok := c.helps[sub]
	if !ok {
		var out bytes.Buffer
		if err := run(context.Background(), []string{"herald", sub, "--help"}, func(string) string { return "" }, &out, io.Discard); err == nil {
			help = out.String()
		}
		c.helps[sub] = help
	}
	if help == "" || sub == "help" || strings.HasPrefix(sub, "-") {
		c.problem(file, "no herald subcommand %s", sub)
		return sub
	}
	takesValue := map[string]bool{}
	for _, m := range flagLine.FindAllStringSubmatch(help, -1) {
		takesValue[m[1]] = m[2] != ""
	}
	for i := 1; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			c.problem(file, "herald %s takes no argument %s", sub, a)
			continue
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		value, known := takesValue[name]
		if !known {
			c.problem(file, "herald %s has no flag --%s", sub, name)
			continue
		}
		if value && !hasValue {
			i++
		}
	}
	return sub
}

// checkProbe checks that a probe of kind asks Herald's path for it, on a
// port the container declares.
func (c *deployCheck) checkProbe(file, kind string, probe any, ports []string) {
	get, _ := mapOf(probe)["httpGet"].(map[string]any)
	if get == nil {
		c.problem(file, "%s probe is not an HTTP GET", kind)
		return
	}
	c.probes++
	want := map[string]string{"liveness": api.HealthPath, "readiness": api.ReadyPath, "startup": api.ReadyPath}[kind]
	if p, _ := get["path"].(string); p != want {
		c.problem(file, "%s probe asks %s; Herald answers it on %s", kind, p, want)
	}
	if port, ok := get["port"].(string); ok && !slices.Contains(ports, port) {
		c.problem(file, "%s probe's port %s is none of the container's (%s)", kind, port, strings.Join(ports, ", "))
	}
}

func mapOf(v any) map[string]any { m, _ := v.(map[string]any); return m }

func listOf(v any) []any { l, _ := v.([]any); return l }

func stringsOf(v any) []string {
	var out []string
	for _, e := range listOf(v) {
		out = append(out, fmt.Sprint(e))
	}
	return out
}

// yamlFile reads Kubernetes manifests and compose files: every map with an
// image of Herald's (a container, a compose service), or a compose build.
func (c *deployCheck) yamlFile(file string, b []byte) {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for {
		var doc any
		if err := dec.Decode(&doc); err != nil {
			if !errors.Is(err, io.EOF) {
				c.problem(file, "%v", err)
			}
			return
		}
		c.walk(file, doc)
	}
}

func (c *deployCheck) walk(file string, v any) {
	switch v := v.(type) {
	case map[string]any:
		image, _ := v["image"].(string)
		_, build := v["build"]
		if strings.Contains(image, "herald") || build {
			c.container(file, v)
			return
		}
		for _, e := range v {
			c.walk(file, e)
		}
	case []any:
		for _, e := range v {
			c.walk(file, e)
		}
	}
}

// container checks one container or compose service running Herald's
// image, whose entrypoint is the binary: args (Kubernetes) or command
// (compose) are what follows it, and serve is the image's default.
func (c *deployCheck) container(file string, m map[string]any) {
	args := stringsOf(m["args"])
	if cmd := stringsOf(m["command"]); len(cmd) > 0 {
		if _, k8s := m["args"]; k8s || strings.HasSuffix(cmd[0], "herald") {
			args = append(cmd[1:], args...)
		} else {
			args = cmd
		}
	}
	sub := c.checkCommand(file, args)
	if len(args) == 0 {
		sub = "serve"
	}
	for _, e := range listOf(m["env"]) {
		c.checkEnv(file, sub, fmt.Sprint(mapOf(e)["name"]))
	}
	switch env := m["environment"].(type) {
	case map[string]any:
		for k := range env {
			c.checkEnv(file, sub, k)
		}
	case []any:
		for _, e := range env {
			k, _, _ := strings.Cut(fmt.Sprint(e), "=")
			c.checkEnv(file, sub, k)
		}
	}
	var ports []string
	for _, p := range listOf(m["ports"]) {
		if name, ok := mapOf(p)["name"].(string); ok {
			ports = append(ports, name)
		}
	}
	for _, kind := range []string{"liveness", "readiness", "startup"} {
		if probe, ok := m[kind+"Probe"]; ok {
			c.checkProbe(file, kind, probe, ports)
		}
	}
}

// unitFile reads a systemd unit: its ExecStart and its Environment lines.
func (c *deployCheck) unitFile(file string, b []byte) {
	sub := ""
	var env []string
	s := bufio.NewScanner(bytes.NewReader(b))
	for s.Scan() {
		key, value, ok := strings.Cut(strings.TrimSpace(s.Text()), "=")
		switch {
		case !ok:
		case key == "ExecStart" || key == "ExecStartPre":
			fields := strings.Fields(strings.TrimLeft(value, "-+!@:"))
			if len(fields) > 0 && path.Base(fields[0]) == "herald" {
				sub = c.checkCommand(file, fields[1:])
			}
		case key == "Environment":
			for _, f := range strings.Fields(value) {
				name, _, _ := strings.Cut(strings.Trim(f, `"'`), "=")
				env = append(env, name)
			}
		}
	}
	for _, name := range env {
		c.checkEnv(file, sub, name)
	}
}

// envLine is a NAME=value line of a settings file, or one commented out
// for the operator to fill in: both must be Herald's.
var envLine = regexp.MustCompile(`(?m)^\s*(?:#\s*)?([A-Z][A-Z0-9_]*)=`)

func (c *deployCheck) envFile(file string, b []byte) {
	for _, m := range envLine.FindAllSubmatch(b, -1) {
		c.checkEnv(file, "", string(m[1]))
	}
}

// containerfile reads the image's ENV and CMD.
func (c *deployCheck) containerfile(file string, b []byte) {
	s := bufio.NewScanner(bytes.NewReader(b))
	for s.Scan() {
		instr, rest, _ := strings.Cut(strings.TrimSpace(s.Text()), " ")
		switch instr {
		case "ENV":
			name, _, _ := strings.Cut(rest, "=")
			c.checkEnv(file, "serve", name)
		case "CMD":
			var args []string
			if err := json.Unmarshal([]byte(rest), &args); err != nil {
				c.problem(file, "CMD is not in JSON form: %v", err)
				continue
			}
			c.checkCommand(file, args)
		}
	}
}
