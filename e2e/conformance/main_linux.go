package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"

	"kube-proxy/e2e/conformance/images"
	"kube-proxy/e2e/conformance/results"
	"kube-proxy/e2e/harness"
)

// Implementations of kube-proxy the lab runs.
const (
	implOurs     = "ours"
	implUpstream = "upstream"
)

// runSpec is one kube-proxy the tests run against.
type runSpec struct{ Impl, Mode, Way string }

// Name is the run's directory name.
func (r runSpec) Name() string { return r.Impl + "-" + r.Mode + "-" + r.Way }

func parseRuns(s string) ([]runSpec, error) {
	var out []runSpec
	for _, item := range strings.Split(s, ",") {
		f := strings.Split(strings.TrimSpace(item), "/")
		if len(f) != 3 {
			return nil, fmt.Errorf("run %q: want impl/mode/way (ours/nftables/daemonset, say)", item)
		}
		r := runSpec{Impl: f[0], Mode: f[1], Way: f[2]}
		switch {
		case r.Impl != implOurs && r.Impl != implUpstream:
			return nil, fmt.Errorf("run %q: impl is ours or upstream", item)
		case r.Mode != "iptables" && r.Mode != "nftables" && r.Mode != "userspace":
			return nil, fmt.Errorf("run %q: mode is iptables, nftables or userspace (this kernel has no IP_VS for ipvs)", item)
		case r.Impl == implUpstream && r.Mode == "userspace":
			return nil, fmt.Errorf("run %q: upstream has no mode userspace", item)
		case r.Way != wayProcess && r.Way != wayDaemonSet:
			return nil, fmt.Errorf("run %q: way is process or daemonset", item)
		case r.Impl == implUpstream && r.Way == wayDaemonSet:
			return nil, fmt.Errorf("run %q: the lab has no upstream kube-proxy image; run upstream as a process", item)
		}
		out = append(out, r)
	}
	return out, nil
}

// selection is which of upstream's tests run, and how.
type selection struct {
	focus, skip string
	procs       int
	timeout     time.Duration
}

// Defaults: every Services test and the Granular Checks for Services, but those that need a cloud
// provider or a load balancer, a feature gate, exclusive use of the cluster, or a long time.
const (
	defaultRuns  = "upstream/iptables/process,upstream/nftables/process,ours/iptables/process,ours/nftables/process,ours/userspace/process,ours/iptables/daemonset,ours/nftables/daemonset"
	defaultFocus = `\[sig-network\] (Services|Networking Granular Checks: Services) `
	defaultSkip  = `\[Serial\]|\[Slow\]|\[Disruptive\]|\[Flaky\]|\[Feature:|LoadBalancer|\[sig-network\] Services .*ESIPP`
)

// agnhostPackages are the Debian packages of the agnhost image: what upstream's image (Alpine) has that
// the e2e tests call in exec pods (nc -v -t -u -z, wget, curl, dig, ip, iperf, bash, ps, ping).
var agnhostPackages = []string{"bash", "curl", "wget", "netcat-openbsd", "iproute2", "dnsutils", "iperf",
	"procps", "iputils-ping", "ca-certificates"}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "conformance:", err)
		os.Exit(1)
	}
}

func run() error {
	cache := filepath.Join(cacheHome(), "kube-proxy-e2e", "conformance")
	var (
		resultsDir = flag.String("results", "", "results directory (default bin/conformance/<UTC time>)")
		runsFlag   = flag.String("runs", defaultRuns, "comma-separated impl/mode/way runs, in order")
		focus      = flag.String("focus", defaultFocus, "ginkgo focus")
		skip       = flag.String("skip", defaultSkip, "ginkgo skip")
		procs      = flag.Int("procs", 2, "ginkgo processes")
		timeout    = flag.Duration("timeout", 90*time.Minute, "time limit of each run of the tests")
		doc        = flag.String("doc", "docs/CONFORMANCE.md", "document to write from the results (empty: none)")
		keep       = flag.Bool("keep", false, "leave the lab up after the runs (tear it down with -down)")
		down       = flag.Bool("down", false, "only tear down what an earlier run left, then exit")
		resume     = flag.Bool("resume", false, "keep the runs the -results directory already completed; carry out the others")
	)
	flag.Parse()
	if os.Geteuid() != 0 {
		return errors.New("must run as root (network namespaces, containerd, kubelets)")
	}
	bins := binaries{
		cluster:     harness.DefaultBinDir(),
		conformance: envOr("KP_CONFORMANCE_BINDIR", filepath.Join(cache, "bin")),
		ours:        os.Getenv("KP_BINARY"),
	}
	if v := os.Getenv("KP_CLUSTER_BINDIR"); v != "" {
		bins.cluster = v
	}
	lab := newLab(filepath.Join(cache, "lab"), bins, logf)
	if *down {
		return lab.teardown()
	}
	runs, err := parseRuns(*runsFlag)
	if err != nil {
		return err
	}
	if bins.ours == "" {
		return errors.New("KP_BINARY must name our kube-proxy binary (make conformance sets it)")
	}
	for _, tool := range []string{"containerd", "ctr", "runc", "nsenter", "ip", "tar", "debootstrap", "/usr/lib/cni/bridge"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not found: install containerd, runc, containernetworking-plugins and debootstrap (.ci/deps.sh --conformance)", tool)
		}
	}
	if *resultsDir == "" {
		if *resume {
			return errors.New("-resume needs -results: the directory whose completed runs to keep")
		}
		*resultsDir = filepath.Join("bin", "conformance", time.Now().UTC().Format("20060102-150405"))
	}
	if err := os.MkdirAll(filepath.Join(*resultsDir, "runs"), 0o755); err != nil {
		return err
	}
	if *resultsDir, err = filepath.Abs(*resultsDir); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	meta := &results.Meta{Date: time.Now().UTC(), Command: "make conformance", Focus: *focus, Skip: *skip, Procs: *procs,
		Versions: map[string]string{}}
	timed := func(name string, fn func() (string, error)) error {
		start := time.Now()
		note, err := fn()
		meta.Phases = append(meta.Phases, results.Phase{Name: name, Seconds: time.Since(start).Seconds(), Note: note})
		logf("%s: %.0f s %s", name, time.Since(start).Seconds(), note)
		return err
	}
	writeMeta := func() error { return results.WriteJSON(filepath.Join(*resultsDir, "meta.json"), meta) }
	kept := map[string]bool{}
	if *resume {
		if kept, err = resumeFrom(*resultsDir, meta); err != nil {
			return fmt.Errorf("-resume: %w", err)
		}
	}

	for _, b := range []struct{ name, script, dir string }{
		{"build: apiserver, etcd, upstream kube-proxy", "e2e/tools/build-cluster.sh", bins.cluster},
		{"build: kubelet, controller-manager, scheduler, kubectl, e2e.test, agnhost, ginkgo, CoreDNS", "e2e/tools/build-conformance.sh", bins.conformance},
	} {
		if err := timed(b.name, func() (string, error) { return buildStep(ctx, b.script, b.dir) }); err != nil {
			return err
		}
	}
	var archives []string
	var pause string
	if err := timed("images: agnhost, pause, busybox, kube-proxy", func() (note string, err error) {
		archives, pause, note, err = buildImages(ctx, cache, bins)
		return note, err
	}); err != nil {
		return err
	}
	collectVersions(meta, bins)
	lab.kubeProxyVersions = map[string]string{"ours": meta.Versions["ours"], "upstream": meta.Versions[upstreamVersionKey]}

	if err := lab.teardown(); err != nil {
		return fmt.Errorf("removing what an earlier run left: %w", err)
	}
	if !*keep {
		defer func() {
			if err := timed("teardown", func() (string, error) { return "", lab.teardown() }); err != nil {
				logf("teardown: %v", err)
			}
			if err := writeMeta(); err != nil {
				logf("writing meta.json: %v", err)
			}
		}()
	}
	var cs kubernetes.Interface
	if err := timed("lab up: network, control plane, CoreDNS, 3 nodes Ready", func() (string, error) {
		var err error
		cs, err = lab.up(ctx, pause, archives)
		return "", err
	}); err != nil {
		return err
	}

	var failed []string
	for _, spec := range runs {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if kept[spec.Name()] {
			logf("run %s: kept from %s", spec.Name(), *resultsDir)
			continue
		}
		// What an interrupted attempt left must not be read as this run's.
		if err := os.RemoveAll(filepath.Join(*resultsDir, "runs", spec.Name())); err != nil {
			return err
		}
		if err := timed("run "+spec.Name(), func() (string, error) {
			return lab.runOne(ctx, cs, spec, selection{focus: *focus, skip: *skip, procs: *procs, timeout: *timeout},
				filepath.Join(*resultsDir, "runs", spec.Name()))
		}); err != nil {
			logf("run %s: %v", spec.Name(), err)
			failed = append(failed, spec.Name())
		}
		if err := writeMeta(); err != nil {
			return err
		}
	}
	if *doc != "" {
		if err := results.WriteDocument(*resultsDir, *doc); err != nil {
			return err
		}
		logf("wrote %s from %s", *doc, *resultsDir)
	}
	if len(failed) > 0 {
		return fmt.Errorf("runs that could not be carried out: %s (see %s)", strings.Join(failed, ", "), *resultsDir)
	}
	return nil
}

// runOne installs the run's kube-proxy, runs the tests against it, and removes it again.
func (l *Lab) runOne(ctx context.Context, cs kubernetes.Interface, spec runSpec, sel selection, dir string) (string, error) {
	proxy, err := l.startProxy(ctx, cs, spec)
	if err != nil {
		err = fmt.Errorf("starting kube-proxy: %w", err)
		_ = os.MkdirAll(dir, 0o755)
		_ = results.WriteJSON(filepath.Join(dir, "run.json"), &results.Run{Impl: spec.Impl, Mode: spec.Mode, Way: spec.Way,
			Start: time.Now().UTC(), Error: err.Error()})
		return "", errors.Join(err, l.stopProxy(ctx, cs, proxy))
	}
	run, err := l.runE2E(ctx, spec, sel, dir)
	stopErr := l.stopProxy(ctx, cs, proxy)
	if err != nil {
		return "", errors.Join(err, stopErr)
	}
	return fmt.Sprintf("tests %.0f s, ginkgo exit %d", run.Seconds, run.ExitCode), stopErr
}

// up brings the lab up and returns an admin client.
func (l *Lab) up(ctx context.Context, pause string, archives []string) (kubernetes.Interface, error) {
	if err := os.RemoveAll(l.Dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(l.Dir, 0o755); err != nil {
		return nil, err
	}
	if err := l.saveSysctls(); err != nil {
		return nil, err
	}
	if err := l.setupNetwork(ctx); err != nil {
		return nil, err
	}
	if err := l.writePKI(); err != nil {
		return nil, err
	}
	cs, err := l.startControlPlane(ctx)
	if err != nil {
		return nil, err
	}
	if err := l.startDNS(ctx, cs); err != nil {
		return nil, err
	}
	for _, n := range l.nodes {
		if err := l.startNode(ctx, cs, n, pause, archives); err != nil {
			return nil, fmt.Errorf("node %s: %w", n.name, err)
		}
	}
	return cs, l.waitNodesReady(ctx, cs)
}

// buildStep runs a build script (cached builds return at once) and says which it was.
func buildStep(ctx context.Context, script, dir string) (string, error) {
	cmd := exec.CommandContext(ctx, script, dir)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s: %w", script, err)
	}
	if time.Since(start) < 10*time.Second {
		return "cached", nil
	}
	return "built", nil
}

// buildImages builds (or finds cached) the image archives every node imports: agnhost and busybox on a
// Debian tree with the tools the tests call, pause (agnhost's pause on the same tree), and our
// kube-proxy from packaging/container/Dockerfile. The names are those e2e.test asks for.
func buildImages(ctx context.Context, cache string, bins binaries) (archives []string, pause, note string, err error) {
	out, err := exec.CommandContext(ctx, bins.k8s("e2e.test"), "--list-images").Output()
	if err != nil {
		return nil, "", "", fmt.Errorf("e2e.test --list-images: %w", err)
	}
	// Every public tag of the three images (upstream's current and previous agnhost and busybox, say);
	// the private-registry agnhost is for a test of pull secrets, which this bed cannot serve.
	want := map[string][]string{}
	for _, line := range strings.Fields(string(out)) {
		for _, name := range []string{"/agnhost:", "/busybox:", "/pause:"} {
			if strings.Contains(line, name) && !strings.Contains(line, "authenticated") && !strings.Contains(line, "private") {
				want[name] = append(want[name], line)
			}
		}
	}
	if len(want) != 3 {
		return nil, "", "", fmt.Errorf("e2e.test --list-images named %v, want agnhost, busybox and pause", want)
	}
	mirror := debianMirror()
	dir := filepath.Join(cache, "images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, "", "", err
	}
	start := time.Now()
	base, err := images.Rootfs{Suite: "bookworm", Packages: agnhostPackages}.Build(ctx, cache, mirror, logf)
	if err != nil {
		return nil, "", "", err
	}
	agn := []images.File{{Src: bins.k8s("agnhost"), Dst: "/agnhost", Mode: 0o755}}
	imgs := []images.Image{
		{Tags: want["/agnhost:"], Rootfs: base, Files: agn, Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"}},
		{Tags: want["/pause:"], Rootfs: base, Files: agn, Entrypoint: []string{"/agnhost", "pause"}},
		{Tags: want["/busybox:"], Rootfs: base, Cmd: []string{"sh"}},
	}
	// Our image: the Dockerfile, with the build context make release gives it (the binary named by arch).
	ctxDir := filepath.Join(dir, "context")
	_ = os.RemoveAll(ctxDir)
	if err := os.MkdirAll(ctxDir, 0o755); err != nil {
		return nil, "", "", err
	}
	if err := copyFile(bins.ours, filepath.Join(ctxDir, "kube-proxy-linux-amd64")); err != nil {
		return nil, "", "", err
	}
	df, err := os.ReadFile(filepath.Join(repoRoot(), "packaging/container/Dockerfile"))
	if err != nil {
		return nil, "", "", err
	}
	spec, err := images.ParseDockerfile(string(df), ctxDir, map[string]string{"TARGETARCH": "amd64"})
	if err != nil {
		return nil, "", "", fmt.Errorf("packaging/container/Dockerfile: %w", err)
	}
	kpBase, err := spec.Rootfs.Build(ctx, cache, mirror, logf)
	if err != nil {
		return nil, "", "", err
	}
	// Archives and file layers are made anew; the trees' layers are reused while the trees are unchanged.
	stale, _ := filepath.Glob(filepath.Join(dir, "*.tar"))
	for _, f := range stale {
		if !strings.HasPrefix(filepath.Base(f), "rootfs-") {
			_ = os.Remove(f)
		}
	}
	ours := images.Image{Tags: []string{ourImageRef}, Rootfs: kpBase, Files: spec.Files, Entrypoint: spec.Entrypoint}
	for name, imgs := range map[string][]images.Image{"e2e-test-images.tar": imgs, "kube-proxy.tar": {ours}} {
		path := filepath.Join(dir, name)
		if err := images.WriteArchive(ctx, path, dir, imgs...); err != nil {
			return nil, "", "", err
		}
		archives = append(archives, path)
	}
	return archives, want["/pause:"][0], fmt.Sprintf("%.0f s", time.Since(start).Seconds()), nil
}

// upstreamVersionKey names upstream's version in meta.json.
const upstreamVersionKey = "kubernetes (e2e.test, kubelet, apiserver, upstream kube-proxy)"

// resumeFrom loads the results directory an earlier invocation wrote, for -resume: meta takes its date and
// timed phases, and the runs it completed are returned by name, to be kept. The earlier invocation must
// have chosen the same tests. A kept run that predates the per-run version gets the one its meta.json
// recorded, since that is the binary it ran.
func resumeFrom(dir string, meta *results.Meta) (map[string]bool, error) {
	old, err := results.Load(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]bool{}, nil // nothing to resume: a first invocation
	}
	if err != nil {
		return nil, err
	}
	if old.Meta.Focus != meta.Focus || old.Meta.Skip != meta.Skip || old.Meta.Procs != meta.Procs {
		return nil, fmt.Errorf("%s chose other tests (focus %q, skip %q, %d processes)", dir, old.Meta.Focus, old.Meta.Skip, old.Meta.Procs)
	}
	meta.Date = old.Meta.Date
	meta.Phases = append(old.Meta.Phases, results.Phase{Name: "-resume: the phases below are a second invocation",
		Note: time.Now().UTC().Format(time.RFC3339)})
	kept := map[string]bool{}
	for _, r := range old.Runs {
		if !r.Complete() {
			continue
		}
		name := r.Name()
		kept[name] = true
		if r.KubeProxy == "" {
			r.KubeProxy = old.Meta.Versions[map[string]string{"ours": "ours", "upstream": upstreamVersionKey}[r.Impl]]
			if err := results.WriteJSON(filepath.Join(dir, "runs", name, "run.json"), r); err != nil {
				return nil, err
			}
		}
	}
	return kept, nil
}

// collectVersions records what ran.
func collectVersions(meta *results.Meta, bins binaries) {
	first := func(name string, args ...string) string {
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			return "unknown"
		}
		return strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
	}
	meta.Versions[upstreamVersionKey] = first(bins.k8s("kubelet"), "--version")
	out, _ := exec.Command(bins.ours, "--version").CombinedOutput()
	meta.Versions["ours"] = strings.Join(strings.Fields(string(out)), " ")
	meta.Versions["containerd"] = first("containerd", "--version")
	meta.Versions["runc"] = first("runc", "--version")
	meta.Versions["coredns"] = first(bins.k8s("coredns"), "-version")
	meta.Versions["kernel"] = first("uname", "-r")
}

func debianMirror() string {
	if v := os.Getenv("KP_LAB_MIRROR"); v != "" {
		return v
	}
	b, _ := os.ReadFile("/etc/apt/sources.list.d/debian.sources")
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "URIs:" {
			return f[1]
		}
	}
	return "http://deb.debian.org/debian"
}

func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o755)
}

// repoRoot is the repository's top directory (make runs the lab from there).
func repoRoot() string {
	wd, _ := os.Getwd()
	return wd
}

func cacheHome() string {
	if v := os.Getenv("XDG_CACHE_HOME"); v != "" {
		return v
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache")
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[conformance %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}
