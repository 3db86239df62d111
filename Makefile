# kube-proxy: a drop-in kube-proxy as a systemd-managed node daemon.
#   make build   static binary bin/kube-proxy
#   make unit    fast tests (no root, no servers)
#   make test    everything CI runs (installs packages, builds a real apiserver, root)
#   make demo    a real apiserver, the daemon in a node namespace, a Service across three pods (MODE=nftables)
#   make bench   ours vs upstream kube-proxy side by side, modes iptables and nftables; writes BENCHMARKS.md
#                (hours; see BENCHFLAGS)
#   make conformance  upstream's e2e tests for Services on a three-node cluster in this machine, against ours and
#                upstream's kube-proxy; writes docs/CONFORMANCE.md (hours; opt-in, not part of make test)

SHELL       := /bin/bash
export PATH := /usr/local/go/bin:$(PATH)
export GOFLAGS := -mod=mod
export GOTOOLCHAIN := local

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo v0.0.0-dev)
COMMIT  ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS := -s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT)
BIN     := bin/kube-proxy

# Where the real apiserver/etcd/upstream kube-proxy binaries are built and cached.
KP_CLUSTER_BINDIR ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/kube-proxy-e2e/bin
export KP_CLUSTER_BINDIR

.PHONY: all build build-faults unit lint deps cluster-bins e2e test demo clean fuzz release systemd-lab bench bench-quick faults conformance

all: build

# go's build cache makes these cheap when nothing changed, so they always run.
build:
	CGO_ENABLED=0 go build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) .

# A binary with the test-only fault switches compiled in (build tag faultinject); never shipped.
build-faults:
	CGO_ENABLED=0 go build -tags faultinject -trimpath -ldflags '$(LDFLAGS)' -o bin/kube-proxy-faults .

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	go vet ./...

unit: lint
	go test -count=1 ./config/... ./proxy/... ./rules/... ./systemd/... ./packaging/... .
	go test -count=1 -race ./proxy/...

# Short fuzz runs of every fuzz target (CI keeps them brief; run longer by hand with FUZZTIME=5m).
# Each input that finds new code is minimised first, by default for up to 60 s per worker: with seeds of
# several KB that took the whole 20 s, and the fuzzers ran about 30 inputs. A 1 s cap keeps them fuzzing.
FUZZTIME ?= 20s
FUZZFLAGS = -run='^$$' -fuzztime=$(FUZZTIME) -fuzzminimizetime=1s
fuzz:
	go test $(FUZZFLAGS) -fuzz=FuzzDecode ./config/
	go test $(FUZZFLAGS) -fuzz=FuzzRender ./rules/iptables/

deps:
	.ci/deps.sh

cluster-bins: deps
	e2e/tools/build-cluster.sh $(KP_CLUSTER_BINDIR)

# Kernel and end-to-end tests (root): the renderer's real-kernel checks in throwaway network namespaces,
# then the real apiserver + etcd with the built binary in network namespaces.
# Packages run one at a time (-p 1): their timing-sensitive checks (stop within 2 s, the watchdog, a held
# xtables lock, no failed request across a reload or endpoint churn) must not share the two cores with
# another package's traffic. Two packages at once cost about 5 minutes less, but nftables' zero-failure
# checks lost 1 connection in 3,420 and in 17,140 beside the systemd lab and mode userspace's traffic.
# The IPVS VM (qemu without KVM) and the systemd lab's containers, the heaviest, run last; e2e/ipvsvm
# includes the short form of mode ipvs's fault rows (TestIPVSFaultsInVM: one more boot, 95 s here idle,
# about 3 minutes with the cores busy).
E2E_ENV := KP_E2E=1 KP_BINARY=$(CURDIR)/$(BIN) KP_FAULTS_BINARY=$(CURDIR)/bin/kube-proxy-faults
E2E_HEAVY := /e2e/ipvsvm|/e2e/systemdlab
e2e: build build-faults cluster-bins
	$(E2E_ENV) go test -count=1 -p 1 -timeout 40m $$(go list ./rules/... ./e2e/... | grep -Ev '$(E2E_HEAVY)')
	$(E2E_ENV) go test -count=1 -p 1 -timeout 30m $$(go list ./e2e/... | grep -E '$(E2E_HEAVY)')

test: deps unit fuzz e2e bench-quick

# Ours vs upstream kube-proxy (built with the cluster binaries), side by side on this machine; results in
# bin/bench/<timestamp>/, tables into BENCHMARKS.md. BENCHFLAGS picks modes and sizes: '-n 1000,5000 -m 3 -runs 3',
# '-mode nftables -n 1000,10000 -m 3'.
BENCHFLAGS ?=
bench: deps build cluster-bins
	KP_BINARY=$(CURDIR)/$(BIN) go run ./e2e/bench $(BENCHFLAGS)

# The CI variant: N=1000, M=3, one run, a few changes, both modes; checks the benchmark still runs (no report).
bench-quick: deps build cluster-bins
	KP_BINARY=$(CURDIR)/$(BIN) go run ./e2e/bench -quick

# MODE=nftables runs the daemon in mode nftables (default: iptables).
MODE ?= iptables
demo: deps build cluster-bins
	KP_BINARY=$(CURDIR)/$(BIN) KP_MODE=$(MODE) go run ./e2e/demo

# Release artifacts for linux/amd64 and linux/arm64 into dist/: binaries, tarballs, .debs, SHA256SUMS.
release:
	VERSION=$(VERSION) COMMIT=$(COMMIT) LDFLAGS='$(LDFLAGS)' packaging/release.sh $(CURDIR)/dist

# The fault table in full (KP_FAULTS_LONG: the apiserver down 120 s, the xtables lock held 5 min, every
# apply failing 10 min, 100,000 endpoint changes over 10,000 Services; about an hour), then mode ipvs's
# rows in the qemu VM (TestIPVSFaultsInVM, about 20 minutes more), then docs/RELIABILITY.md from all the
# rows. make e2e runs the short form of every row (ipvs's with the rest of e2e/ipvsvm).
# The document is written from the rows measured even when a row's check failed (make then fails too).
faults: deps build build-faults cluster-bins
	rm -f bin/fault-rows.jsonl
	$(E2E_ENV) KP_FAULTS_LONG=1 KP_FAULTS_ROWS=$(CURDIR)/bin/fault-rows.jsonl go test -count=1 -timeout 150m -v ./e2e/faults/; \
	status=$$?; \
	$(E2E_ENV) KP_FAULTS_LONG=1 KP_FAULTS_ROWS=$(CURDIR)/bin/fault-rows.jsonl go test -count=1 -timeout 60m -v -run '^TestIPVSFaultsInVM$$' ./e2e/ipvsvm/ || status=1; \
	go run ./e2e/faults/report -rows bin/fault-rows.jsonl -out docs/RELIABILITY.md -command 'make faults' && exit $$status

# Upstream's e2e tests for Services ([sig-network] Services and Networking Granular Checks: Services, not
# Serial/Slow/Disruptive/LoadBalancer/Feature) on a three-node cluster built in network namespaces here
# (containerd, kubelet, CNI, CoreDNS), against ours in modes iptables, nftables and userspace as a process
# and in iptables and nftables as the DaemonSet, and upstream's kube-proxy in iptables and nftables as a
# process. Builds and caches kubelet, the controller-manager, the scheduler, kubectl, e2e.test, agnhost,
# ginkgo and CoreDNS beside the cluster binaries; results in bin/conformance/<time>/, then
# docs/CONFORMANCE.md. CONFORMANCEFLAGS picks runs and tests: -runs ours/nftables/daemonset -focus ...
CONFORMANCEFLAGS ?=
conformance: build
	.ci/deps.sh --conformance
	KP_BINARY=$(CURDIR)/$(BIN) go run ./e2e/conformance $(CONFORMANCEFLAGS)

# Only the real-systemd tests (they are part of make e2e too).
systemd-lab: deps build build-faults cluster-bins
	$(E2E_ENV) go test -count=1 -timeout 20m -v ./e2e/systemdlab/

clean:
	rm -rf bin dist
