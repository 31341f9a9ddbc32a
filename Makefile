# Herald's two front doors are `make run` and `make test`; everything else
# here serves them. No Docker: PostgreSQL runs from the installed binaries
# (db/cluster.sh).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
GO ?= go
SQLC_VERSION := v1.31.1
SQLC := $(GO) run github.com/sqlc-dev/sqlc/cmd/sqlc@$(SQLC_VERSION)
DEV ?= .dev
# Packages whose tests exercise concurrency run under the race detector;
# that is all of them today.
RACE ?= -race
# What `herald version` and herald_build_info say of a build: the release
# (a tag, else the commit's short name, marked -dirty for uncommitted
# changes), the commit and the build's time.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)
BUILD_DATE ?= $(shell date -u +%Y-%m-%dT%H:%M:%SZ)
LDFLAGS := -X main.version=$(VERSION) -X main.commit=$(COMMIT) -X main.buildDate=$(BUILD_DATE)

.PHONY: help build run test test-e2e test/go test/e2e test/fuzz lint chromium promtool pgbouncer bench generate generate/check vet fmt lint/openapi \
	db/start db/stop db/reset db/test/start db/test/stop clean \
	buildah umoci image image/context test/image release-snapshot

help:
	@echo "make run      start a local PostgreSQL, migrate, and serve Herald with a development API key"
	@echo "make test     start a PostgreSQL in RAM if needed, check generated code, vet, lint, and run the fast tier of tests"
	@echo "make test-e2e the slow tier: the bench, make run, crashes, database faults, the image, the browser, fuzzing"
	@echo "make build    build bin/herald"
	@echo "make bench    the dispatch benchmark; the JSON result ends up in bench/results/latest.json"
	@echo "make generate regenerate db/ from db/queries/*.sql with sqlc, and api/client from api/openapi.yaml"
	@echo "make db/start | db/stop | db/reset   the development database"
	@echo "make image    the container image (deploy/image/Containerfile) with buildah, no Docker daemon"
	@echo "make release-snapshot   GoReleaser's archives and checksums in dist/, published nowhere"

# The first build downloads the modules and compiles some 600 packages, which
# takes minutes on a small machine: it counts them as it goes, so that a quiet
# terminal never looks like a hung one. Later builds compile only what changed.
build:
	@if [ ! -x bin/herald ]; then echo "building bin/herald: the first build fetches the modules and compiles everything (minutes on 2 cores)"; \
	else echo "building bin/herald"; fi
	@$(GO) build -v -ldflags '$(LDFLAGS)' -o bin/herald ./cmd/herald 2>&1 | awk ' \
		/^(go: |# |.*\.go:[0-9])/ { print; fflush(); next } \
		/^[A-Za-z0-9._~\/-]+$$/ { if (++n % 50 == 0) { printf "  %d packages compiled\n", n; fflush() } next } \
		{ print; fflush() }'

# The development cluster lives under .dev/pg and survives restarts; the
# development API key is minted once and kept in .dev/api-key.
db/start:
	@if [ -n "$${DATABASE_URL:-}" ]; then echo "$$DATABASE_URL"; else db/cluster.sh start dev; fi

db/stop:
	@db/cluster.sh stop dev
	@db/cluster.sh stop test

db/reset:
	@db/cluster.sh reset dev

db/test/start:
	@if [ -n "$${DATABASE_URL:-}" ]; then echo "$$DATABASE_URL"; else db/cluster.sh start test; fi

db/test/stop:
	@db/cluster.sh stop test

# make run (cmd/run.sh) also starts `herald fakepush` (the local APNs, FCM
# and Web Push) and points Herald at it, so pushes flow without any real
# credentials. Its settings: DATABASE_URL, HERALD_ADDR, FAKEPUSH_ADDR,
# FAKEPUSH_LATENCY, FAKEPUSH_DELIVERED, FAKEPUSH_OPENED, HERALD_LOG_FORMAT and
# DEV (see the script).
run: build
	@DEV=$(DEV) cmd/run.sh

# The dispatch benchmark, on the development cluster (durable, like
# production): a fresh database, fakepush and Herald in processes of their
# own. Flags go through BENCH_FLAGS, e.g. make bench BENCH_FLAGS='--users 20000'.
bench: build
	@url=$$($(MAKE) -s db/start); \
	DATABASE_URL=$$url bin/herald bench $(BENCH_FLAGS)

# Two tiers of tests, split by name. make test is the one to run after
# every change: unit and integration tests, and end-to-end tests that start
# Herald on a database cloned from a migrated template (a few minutes on
# two cores). make test-e2e runs the tests whose names begin with TestE2E,
# which take minutes each, load the machine or need more than PostgreSQL:
# the bench and the soak, the attack loads, make run, kill -9 and SIGTERM mid
# fan-out, PostgreSQL restarted and stopped, a rolling upgrade, the image,
# the browser; then a brief fuzzing run. .ci/run runs both.
test: generate/check vet lint test/go

test-e2e: test/e2e test/fuzz

test/go: promtool
	@url=$$($(MAKE) -s db/test/start); \
	echo "go test (fast tier) against $$url"; \
	DATABASE_URL=$$url $(GO) test $(RACE) -count=1 -timeout 10m -skip '^TestE2E' ./...

test/e2e: chromium promtool buildah umoci pgbouncer
	@url=$$($(MAKE) -s db/test/start); \
	echo "go test (e2e tier) against $$url"; \
	DATABASE_URL=$$url $(GO) test $(RACE) -count=1 -timeout 25m -run '^TestE2E' ./...

# A brief real fuzzing run of the /v1 handlers (api/fuzz_test.go): every
# go test runs only the seed corpus, this one looks for new inputs that are
# a 5xx. A failing input is written to api/testdata/fuzz/FuzzAPI; check it in
# with the fix. The budget is a count of inputs, not a duration: Go 1.26's
# fuzzing coordinator can report its own -fuzztime deadline as a failure
# when a worker is mid-input as the time runs out (golang/go#75804, fixed
# in Go 1.27), which a busy machine makes likely. FUZZTIME=5m (or 500000x)
# fuzzes for longer.
FUZZTIME ?= 30000x
test/fuzz:
	@url=$$($(MAKE) -s db/test/start); \
	DATABASE_URL=$$url $(GO) test -run '^$$' -fuzz '^FuzzAPI$$' -fuzztime $(FUZZTIME) ./api

# golangci-lint, its settings in .golangci.yaml (modelled on River's). It is
# pinned as a Go tool in a module file of its own, .ci/lint.go.mod, so that
# its hundreds of modules never enter Herald's build; its first run builds
# it (minutes), later runs take the build cache's copy.
GOLANGCI_LINT := $(GO) tool -modfile=.ci/lint.go.mod golangci-lint
lint:
	$(GOLANGCI_LINT) run ./...

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt would change:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...

# Tools some tests need, from Debian packages: as root each is installed
# when missing, quietly, refreshing the package lists only if the first try
# fails; elsewhere, or when that fails too, those tests skip and say so
# loudly. $(call apt-tool,command,package,the tests that need it)
define apt-tool
	@if ! command -v $(1) >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "installing $(2) for $(3)"; \
			export DEBIAN_FRONTEND=noninteractive; \
			apt-get install -y -qq $(2) >/dev/null 2>&1 || \
				{ apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq $(2) >/dev/null 2>&1; } || \
				echo "!!! $(2) could not be installed: $(3) will be SKIPPED"; \
		else \
			echo "!!! $(1) is missing and cannot be installed here (apt-get install $(2) as root): $(3) will be SKIPPED"; \
		fi; \
	fi
endef

# The browser tests (cmd/herald/browser_test.go) drive Debian's chromium.
chromium:
	$(call apt-tool,chromium,chromium,the browser tests)

# The pooler tests (cmd/herald/pooler_test.go) run Debian's pgbouncer.
pgbouncer:
	$(call apt-tool,pgbouncer,pgbouncer,the pooler tests)

# The alert rules' tests (jobs/alerts_test.yml, run by
# TestAlertRulesPassPromtool) need promtool, from Debian's prometheus.
promtool:
	$(call apt-tool,promtool,prometheus,the alert rules' tests)

# The Go client of the API, api/client, is generated from api/openapi.yaml
# by oapi-codegen, pinned as a tool in go.mod; its settings are in
# api/client/oapi-codegen.yaml.
OAPI_CODEGEN := $(GO) tool oapi-codegen -config api/client/oapi-codegen.yaml

generate:
	cd db && $(SQLC) generate
	$(OAPI_CODEGEN) api/openapi.yaml > api/client/client.gen.go.new
	mv api/client/client.gen.go.new api/client/client.gen.go

# sqlc diff exits non-zero when the checked-in code differs from what the
# queries and migrations generate; the client is generated again and
# compared.
generate/check:
	@cd db && $(SQLC) diff || { echo "db/ is stale: run 'make generate' and commit the result"; exit 1; }
	@new=$$(mktemp); trap 'rm -f "$$new"' EXIT; \
	$(OAPI_CODEGEN) api/openapi.yaml > "$$new"; \
	cmp -s api/client/client.gen.go "$$new" || { diff -u api/client/client.gen.go "$$new" | head -40 || true; \
		echo "api/client is stale: run 'make generate' and commit the result"; exit 1; }

# Redocly's linter on openapi.yaml, with its recommended rules
# (api/redocly.yaml). It needs npm's registry, so make test does not run it;
# make test holds the document to the rules a generated client needs
# (api/openapi_test.go) and validates it with kin-openapi.
REDOCLY_VERSION := 2.77.0
lint/openapi:
	npx --yes @redocly/cli@$(REDOCLY_VERSION) lint --config api/redocly.yaml api/openapi.yaml

# The container image: FROM scratch, holding the static binary, the build
# host's CA bundle and a passwd naming the non-root user (65532). Its
# context, bin/image, is filled here so that `docker build bin/image` or
# compose (deploy/compose) builds the same image. buildah needs no daemon;
# BUILDAH_FLAGS passes e.g. --storage-driver vfs where overlay cannot
# mount. TestE2EImage (make test/image) builds it, unpacks it and runs it.
IMAGE ?= localhost/herald:$(VERSION)
BUILDAH_FLAGS ?=
CA_BUNDLE ?= /etc/ssl/certs/ca-certificates.crt
image/context:
	@rm -rf bin/image && mkdir -p bin/image/state
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w $(LDFLAGS)' -o bin/image/herald ./cmd/herald
	cp deploy/image/Containerfile deploy/image/passwd deploy/image/group bin/image/
	cp $(CA_BUNDLE) bin/image/ca-certificates.crt

image: buildah image/context
	BUILDAH_ISOLATION=chroot buildah $(BUILDAH_FLAGS) build --isolation chroot -f bin/image/Containerfile -t $(IMAGE) bin/image
	@buildah $(BUILDAH_FLAGS) images --format '{{.Name}}:{{.Tag}} {{.Size}}' $(IMAGE)

buildah:
	$(call apt-tool,buildah,buildah,make image and the image test)

umoci:
	$(call apt-tool,umoci,umoci,the image test)

# The image test alone (cmd/herald/image_test.go): slow (it builds a static
# binary and the image), so it is its own target.
test/image: buildah umoci
	@url=$$($(MAKE) -s db/test/start); \
	DATABASE_URL=$$url $(GO) test -count=1 -v -run '^TestE2EImage' ./cmd/herald

# GoReleaser's snapshot: the archives for linux and darwin, amd64 and arm64,
# and checksums.txt in dist/, from .goreleaser.yaml, published nowhere.
# GoReleaser is pinned here rather than in go.mod's tools, which would add
# hundreds of modules to the main build; its first run builds it (minutes).
GORELEASER_VERSION := v2.15.1
GORELEASER := $(GO) run github.com/goreleaser/goreleaser/v2@$(GORELEASER_VERSION)
release-snapshot:
	COMMIT=$(COMMIT) $(GORELEASER) release --snapshot --clean

clean:
	rm -rf bin dist
