package main

import (
	"cmp"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// version is the release, set at build time with -ldflags "-X
// main.version=v1.2.3" (make release does); "dev" for any other build.
var version = "dev"

// commit and buildDate are the commit the binary was built from and when
// (RFC 3339), set with -ldflags "-X main.commit=... -X main.buildDate=..."
// (make build does). Without them the commit is the one the Go toolchain
// embeds, where it does (-buildvcs).
var commit, buildDate = "", ""

// buildInfo is what a binary says of itself: its release, the commit it was
// built from (and whether the tree had changes), when, with which Go, and
// which River it embeds, so that an operator can tell what runs where and
// which River its migrations are for.
type buildInfo struct {
	Version, Commit, CommitTime, BuildDate, Go, River string
	Modified                                          bool
}

// readBuildInfo gathers the binary's build info: the version and date from
// the linker flags, the rest from what the Go toolchain embeds.
func readBuildInfo() buildInfo {
	b := buildInfo{Version: version, BuildDate: buildDate, Go: runtime.Version(), Commit: cmp.Or(commit, "unknown"), River: "unknown"}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Commit = cmp.Or(commit, s.Value)
		case "vcs.time":
			b.CommitTime = s.Value
		case "vcs.modified":
			b.Modified = s.Value == "true"
		}
	}
	for _, dep := range info.Deps {
		if dep.Path == "github.com/riverqueue/river" {
			b.River = dep.Version
			if dep.Replace != nil {
				b.River = dep.Replace.Version
			}
		}
	}
	return b
}

// write prints the build info, a line each.
func (b buildInfo) write(w io.Writer) {
	commit := b.Commit
	if b.Modified {
		commit += " (with uncommitted changes)"
	}
	fmt.Fprintf(w, "herald %s\ncommit %s\n", b.Version, commit)
	if b.CommitTime != "" {
		fmt.Fprintf(w, "committed %s\n", b.CommitTime)
	}
	if b.BuildDate != "" {
		fmt.Fprintf(w, "built %s\n", b.BuildDate)
	}
	fmt.Fprintf(w, "go %s\nriver %s\n", b.Go, b.River)
}

// register exports the build info as herald_build_info, a gauge of 1 whose
// labels say what runs, as Prometheus exporters do.
func (b buildInfo) register(reg prometheus.Registerer) {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "herald_build_info",
		Help: "Always 1; its labels name the running build: release, commit, Go and River versions.",
	}, []string{"version", "commit", "go_version", "river_version"})
	g.WithLabelValues(b.Version, b.Commit, b.Go, b.River).Set(1)
	reg.MustRegister(g)
}
