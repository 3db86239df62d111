package main

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"kube-proxy/e2e/harness"
)

// bench is one invocation: the options, the binaries, the current cluster and where output goes.
type bench struct {
	o       options
	bins    map[string]string
	cluster *harness.Cluster
	outdir  string // results, logs and profiles of this invocation
	machine machineInfo
	results []RunResult
}

// run is the whole benchmark: per endpoint count a fresh cluster, per Service count (ascending, grown
// incrementally) every run of every implementation, then the report.
func run(ctx context.Context, o options) error {
	if os.Geteuid() != 0 {
		return errors.New("run as root: the benchmark creates network namespaces (it never touches the host's own rules)")
	}
	tools := []string{"ip", restoreTool, saveTool, "iptables-nft"}
	if slices.Contains(o.Modes, proxyNFTables) {
		tools = append(tools, "nft")
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not found: install iptables, nftables and iproute2 (make deps)", tool)
		}
	}
	if removed, err := harness.RemoveStaleNetNS(); err == nil && len(removed) > 0 {
		logf("removed %d network namespaces left by dead runs", len(removed))
	}
	b := &bench{o: o, bins: map[string]string{}}
	for _, impl := range o.Impls {
		switch impl {
		case implOurs:
			bin, err := harness.DaemonBinary()
			if err != nil {
				return err
			}
			b.bins[impl] = bin
		case implUpstream:
			dir, err := harness.BinDir()
			if err != nil {
				return err
			}
			b.bins[impl] = filepath.Join(dir, "kube-proxy")
		}
	}
	if _, err := harness.BuildPodServer(); err != nil {
		return err
	}
	b.machine = describeMachine(b.bins)
	b.outdir = filepath.Join(o.Outdir, time.Now().Format("20060102-150405"))
	if err := os.MkdirAll(b.outdir, 0o755); err != nil {
		return err
	}
	logf("output, logs and profiles in %s", b.outdir)
	logf("machine: %s", b.machine.oneLine())
	for _, impl := range o.Impls {
		logf("%s: %s (%s)", impl, b.bins[impl], b.machine.Versions[impl])
	}
	err := b.runAll(ctx)
	if len(b.results) > 0 {
		fmt.Println()
		fmt.Print(renderReport(b.results, b.o, b.machine))
		if werr := b.writeJSON(); werr != nil {
			err = errors.Join(err, werr)
		}
		if err == nil && o.Output != "" {
			if werr := writeBenchmarks(o.Output, b.results, b.o, b.machine); werr != nil {
				return werr
			}
			logf("wrote %s", o.Output)
		}
	}
	return err
}

func (b *bench) runAll(ctx context.Context) error {
	for _, m := range b.o.M {
		if err := b.runM(ctx, m); err != nil {
			return err
		}
	}
	return nil
}

// runM runs every size with m endpoints per Service against a cluster of its own.
func (b *bench) runM(ctx context.Context, m int) error {
	logf("starting kube-apiserver and etcd")
	clusterDir := filepath.Join(b.outdir, fmt.Sprintf("cluster-m%d", m))
	c, err := harness.StartCluster(ctx, clusterDir)
	if err != nil {
		return err
	}
	b.cluster = c
	defer func() {
		_ = c.Stop()
		if !b.o.Keep {
			_ = os.RemoveAll(clusterDir)
		}
	}()
	w, err := newWorkload(ctx, c, m)
	if err != nil {
		return err
	}
	for _, n := range b.o.N {
		before := len(w.svcs)
		took, err := w.grow(ctx, n, b.o.Workers)
		if err != nil {
			return err
		}
		objects := 2 * (n - before)
		logf("created %d Services × %d endpoints (%d API objects) in %v (%.0f objects/s, %d workers)",
			n-before, m, objects, took.Round(time.Millisecond), float64(objects)/took.Seconds(), b.o.Workers)
		for r := 1; r <= b.o.Runs; r++ {
			res := RunResult{N: n, M: m, Run: r}
			if r == 1 {
				res.Created, res.Objects = took, objects
			}
			if err := b.runOne(ctx, w, &res); err != nil {
				return fmt.Errorf("N=%d M=%d run %d: %w", n, m, r, err)
			}
			b.results = append(b.results, res)
			if err := b.writeJSON(); err != nil {
				return err
			}
		}
	}
	return nil
}

// runOne is one repetition: for each proxy mode, each implementation, config mode then flags mode, one
// at a time (the order of the implementations alternates between runs), then that mode's kernel floors;
// last the data plane's floor.
func (b *bench) runOne(ctx context.Context, w *workload, res *RunResult) error {
	order := slices.Clone(b.o.Impls)
	if res.Run%2 == 0 {
		slices.Reverse(order)
	}
	for _, proxy := range b.o.Modes {
		saved := map[string]string{}
		for _, impl := range order {
			for _, mode := range []string{modeConfig, modeFlags} {
				if c := res.phaseOf(proxy, impl, modeConfig); mode == modeFlags && c != nil && c.ColdCapped {
					logf("N=%d M=%d run %d/%d: mode %s, %s, %s: not run, the config file's cold start did not finish either",
						res.N, res.M, res.Run, b.o.Runs, proxy, impl, modeLabel(mode))
					res.Phases = append(res.Phases, PhaseResult{Impl: impl, Mode: mode, Proxy: proxy, Skipped: true})
					continue
				}
				logf("N=%d M=%d run %d/%d: mode %s, %s, %s", res.N, res.M, res.Run, b.o.Runs, proxy, impl, modeLabel(mode))
				pr, text, err := b.phase(ctx, w, res, proxy, impl, mode)
				if err != nil {
					return fmt.Errorf("mode %s, %s (%s): %w", proxy, impl, modeLabel(mode), err)
				}
				res.Phases = append(res.Phases, pr)
				if mode == modeConfig && text != "" {
					saved[impl] = text
				}
			}
		}
		if b.o.FloorReps == 0 {
			continue
		}
		mid := w.svcs[res.N/2]
		switch proxy {
		case proxyIPTables:
			f, err := measureFloors(saved, mid, b.o.FloorReps, b.o.Quiesce, logf)
			if err != nil {
				return fmt.Errorf("kernel floors: %w", err)
			}
			res.Floors = f
		case proxyNFTables:
			f, err := measureNFTFloors(saved, mid, b.o.FloorReps, b.o.Quiesce, b.o.ColdCap)
			if err != nil {
				return fmt.Errorf("kernel floors of mode nftables: %w", err)
			}
			res.NFTFloors = f
		}
	}
	if b.o.FloorReps > 0 && b.o.Connects > 0 {
		c, err := b.connectFloor(ctx)
		if err != nil {
			return fmt.Errorf("data-plane floor: %w", err)
		}
		res.Floors.Connect = &c
	}
	return nil
}

// connectFloor times new connections to a pod IP from the client namespace through a fresh node that has
// no rules at all: what a new connection costs on this host before any kube-proxy is involved.
func (b *bench) connectFloor(ctx context.Context) (DataPlaneResult, error) {
	quiesce(b.o.Quiesce)
	topo, err := b.bareNode(ctx)
	if err != nil {
		return DataPlaneResult{}, err
	}
	defer func() { _ = topo.Close() }()
	addr := podAddr()
	times, failed, err := connectTimes(topo.Client, []netip.AddrPort{addr}, b.o.Connects, 20)
	if err != nil {
		return DataPlaneResult{}, err
	}
	r := DataPlaneResult{Addr: addr.String(), P50: percentile(times[0], 0.5), P90: percentile(times[0], 0.9),
		Samples: len(times[0]), Fail: failed[0]}
	logf("floor: new connections to a pod IP through a node with no rules: p50 %v p90 %v, %d failed",
		r.P50.Round(time.Microsecond), r.P90.Round(time.Microsecond), r.Fail)
	return r, nil
}

// bareNode makes a topology whose node has no rules at all, its pod serving the sinkRange, and checks
// that a pod IP answers through it. Close it when done.
func (b *bench) bareNode(ctx context.Context) (*harness.Topology, error) {
	topo, err := harness.NewTopology(ctx, 1)
	if err != nil {
		return nil, err
	}
	if err := b.wireSink(ctx, topo); err != nil {
		_ = topo.Close()
		return nil, err
	}
	addr := podAddr()
	if hits, err := harness.Hit(ctx, topo.Client, "tcp", addr.String(), 3); err != nil || hits["pod1"] != 3 {
		_ = topo.Close()
		return nil, fmt.Errorf("%v does not answer through a bare node: %v %s", addr, err, harness.FormatHits(hits))
	}
	return topo, nil
}

// node is one fresh node namespace (with its pod and client namespaces), the apiserver bridged into it and
// the monitor listening there.
type node struct {
	topo       *harness.Topology
	xt         *harness.XTables
	kubeconfig string
	stopBridge func()
	mon        *Monitor
}

// newNode builds a node: a topology with one pod serving the whole sinkRange, the iptables-nft hint, the
// bridge and the monitor. On error it removes what it made.
func (b *bench) newNode(ctx context.Context, dir string) (nd *node, err error) {
	nd = &node{}
	defer func() {
		if err != nil {
			nd.close()
		}
	}()
	if nd.topo, err = harness.NewTopology(ctx, 1); err != nil {
		return nil, err
	}
	if err := b.wireSink(ctx, nd.topo); err != nil {
		return nd, err
	}
	if nd.xt, err = harness.NewXTables(nd.topo.Node, harness.BackendNFT, dir); err != nil {
		return nd, err
	}
	if err := nd.xt.SetHint(ctx); err != nil {
		return nd, err
	}
	if nd.kubeconfig, nd.stopBridge, err = b.cluster.Bridge(nd.topo.Node); err != nil {
		return nd, err
	}
	nd.mon, err = NewMonitor(nd.topo.Node)
	return nd, err
}

// close removes the node: monitor, bridge, namespaces. A daemon stopped just before may leave an
// iptables-restore or -save child finishing inside the node namespace: close waits up to a minute for the
// namespace to empty instead of killing what it did not start.
func (nd *node) close() error {
	if nd.mon != nil {
		nd.mon.Close()
	}
	if nd.stopBridge != nil {
		nd.stopBridge()
	}
	if nd.topo == nil {
		return nil
	}
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if pids, err := nd.topo.Node.PIDs(); err != nil || len(pids) == 0 {
			break
		}
	}
	return nd.topo.Close()
}

// phase runs impl in proxy mode proxy, configured as mode says, in a fresh node namespace: cold start,
// settle, the change loop, the data plane (config mode), and returns its measurements and the rules
// after the cold sync (iptables-save, or nft list table ip kube-proxy). A cold start of mode nftables
// that does not finish within the cap ends the run there, with what it had reached.
func (b *bench) phase(ctx context.Context, w *workload, res *RunResult, proxy, impl, mode string) (pr PhaseResult, saved string, err error) {
	pr = PhaseResult{Impl: impl, Mode: mode, Proxy: proxy}
	n, m := res.N, res.M
	dl := dialectOf(proxy)
	setup := time.Now()
	if waited, busy := quiesce(b.o.Quiesce); waited > time.Second {
		logf("  waited %v for the host to quiet down (last %.0f%% busy)", waited.Round(100*time.Millisecond), 100*busy)
	}
	dir := filepath.Join(b.outdir, fmt.Sprintf("n%d-m%d-run%d-%s-%s-%s", n, m, res.Run, proxy, impl, mode))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return pr, "", err
	}
	nd, err := b.newNode(ctx, dir)
	if err != nil {
		return pr, "", err
	}
	defer func() {
		if cerr := nd.close(); cerr != nil {
			logf("  warning: removing the node namespace: %v", cerr)
		}
	}()
	logf("  node namespace ready in %v", time.Since(setup).Round(time.Millisecond))
	svcs := w.svcs[:n]
	// 1. Cold start.
	cold := nd.mon.Watch(dl.cold(svcs))
	d, err := launch(impl, b.bins[impl], proxy, mode, nd.topo.Node, nd.kubeconfig, dir, []string{nd.xt.Env()}, b.o.Profile)
	if err != nil {
		return pr, "", err
	}
	defer d.stop()
	profile := func(what string) chan error {
		if !b.o.Profile {
			return nil
		}
		return b.profile(ctx, d, filepath.Join(b.outdir, fmt.Sprintf("%s-%s-n%d-m%d-run%d-%s.pprof", proxy, impl, n, m, res.Run, what)))
	}
	var coldProfile chan error
	if mode == modeConfig {
		coldProfile = profile("cold")
	}
	var capAt time.Duration
	if proxy == proxyNFTables {
		capAt = b.o.ColdCap
	}
	if err := b.coldStart(ctx, nd.mon, d, cold, n, &pr, capAt); err != nil {
		if !errors.Is(err, errNotInTime) || capAt == 0 {
			return pr, "", err
		}
		return b.capped(nd, d, dl, svcs, cold, pr)
	}
	settled := time.Now().Add(b.o.Settle)
	if saved, pr.ServicesRules, err = dl.verify(nd.topo.Node, dir, mode, svcs); err != nil {
		return pr, "", err
	}
	if err := wait(coldProfile); err != nil {
		return pr, "", err
	}
	time.Sleep(time.Until(settled))
	if pr.MemCold, err = readMemory(d.proc.PID()); err != nil {
		return pr, "", err
	}

	// 2 and 3. Network programming latency and CPU per change.
	var loopProfile chan error
	if mode == modeFlags {
		loopProfile = profile("changes")
	}
	touched, err := b.changeLoop(ctx, w, dl, nd.mon, d, res, &pr)
	if err != nil {
		return pr, saved, err
	}
	if err := wait(loopProfile); err != nil {
		return pr, saved, err
	}
	time.Sleep(b.o.Settle)
	if pr.MemAfter, err = readMemory(d.proc.PID()); err != nil {
		return pr, saved, err
	}
	if b.o.Profile {
		// The heap after the changes: the profile and, in its text form, the runtime's memory statistics.
		base := filepath.Join(b.outdir, fmt.Sprintf("%s-%s-n%d-m%d-run%d-%s-heap", proxy, impl, n, m, res.Run, mode))
		for what, path := range map[string]string{"heap": base + ".pprof", "heap?debug=1": base + ".txt"} {
			if err := d.fetchPprof(ctx, what, 0, path); err != nil {
				return pr, saved, fmt.Errorf("heap profile of %s: %w", impl, err)
			}
		}
		logf("  heap profile saved: %s.{pprof,txt}", base)
	}

	// 4. Data plane: put the changed Services back first, so every target has its original endpoints.
	if err := w.restore(ctx, touched); err != nil {
		return pr, saved, err
	}
	if mode == modeConfig && b.o.Connects > 0 {
		if err := b.dataPlane(ctx, w, dl, nd.mon, d, nd.topo, n, touched, &pr); err != nil {
			return pr, saved, err
		}
	}
	pr.MonitorLost = nd.mon.Lost()
	if err := d.alive(); err != nil {
		return pr, saved, err
	}
	return pr, saved, nil
}

// coldStart waits for the cold sync (the cold channel from the monitor) and records it in pr. A capAt
// shorter than the cold-start timeout waits that long only (the error is then errNotInTime).
func (b *bench) coldStart(ctx context.Context, mon *Monitor, d *daemon, cold <-chan Gen, n int, pr *PhaseResult, capAt time.Duration) error {
	timeout := b.o.ColdTimeout
	if capAt > 0 && capAt < timeout {
		timeout = capAt
	}
	g, err := waitGen(ctx, mon, cold, d, timeout, fmt.Sprintf("all %d Services", n))
	if err != nil {
		return err
	}
	// The committing iptables-restore's (or nft's) CPU time counts for the daemon once it has reaped it;
	// a daemon writing over netlink itself commits as one of its own threads.
	if !threadOf(g.PID, d.proc.PID()) {
		waitReaped(g.PID, 10*time.Second)
	}
	if pr.ColdCPU, err = readCPU(d.proc.PID()); err != nil {
		return err
	}
	pr.Cold = g.Time.Sub(d.start)
	for _, x := range mon.GensSince(d.start) {
		if x.Time.After(g.Time) {
			break
		}
		if pr.ColdCommits == 0 {
			pr.FirstCommit = x.Time.Sub(d.start)
		}
		pr.ColdCommits++
	}
	logf("  cold start %v (first commit after %v, %d commits; CPU %v + children %v)", pr.Cold.Round(time.Millisecond),
		pr.FirstCommit.Round(time.Millisecond), pr.ColdCommits, pr.ColdCPU.Self.Round(10*time.Millisecond), pr.ColdCPU.Children.Round(10*time.Millisecond))
	return nil
}

// capped records a cold start that did not finish within the cap: the time it had run, the Services
// whose rules were complete, the transactions, CPU and memory until then, the children still running.
// The run ends there: the daemon is stopped, and what it left running in the node namespace (an nft
// still writing the cold sync's transaction) is waited for, at most another cap, so that it does not
// load the host during the next measurement; if that transaction commits meanwhile, when is recorded.
func (b *bench) capped(nd *node, d *daemon, dl dialect, svcs []*service, cold <-chan Gen, pr PhaseResult) (PhaseResult, string, error) {
	mon := nd.mon
	var err error
	pr.ColdCapped = true
	pr.Cold = time.Since(d.start)
	mon.Check(func(v View) bool { pr.ColdProgress = dl.programmed(v, svcs); return true })
	pr.ColdCommits = len(mon.GensSince(d.start))
	if pr.ColdCPU, err = readCPU(d.proc.PID()); err != nil {
		return pr, "", err
	}
	if pr.MemCold, err = readMemory(d.proc.PID()); err != nil {
		return pr, "", err
	}
	pr.MonitorLost = mon.Lost()
	for _, c := range harness.Children(d.proc.PID()) {
		if cpu, err := readCPU(c.PID); err == nil {
			pr.CappedChildren = append(pr.CappedChildren, fmt.Sprintf("`%s` (CPU %s so far)", strings.Join(c.Args, " "),
				formatValue(cpu.Self.Seconds(), unitSeconds)))
		}
	}
	logf("  cold start not finished after %s: %d of %d Services in the kernel, %d commits; CPU %v + children %v; running children: %v",
		formatValue(pr.Cold.Seconds(), unitSeconds), pr.ColdProgress, len(svcs), pr.ColdCommits,
		pr.ColdCPU.Self.Round(10*time.Millisecond), pr.ColdCPU.Children.Round(10*time.Millisecond), pr.CappedChildren)
	if err := d.alive(); err != nil {
		return pr, "", err
	}
	d.stop()
	for deadline := time.Now().Add(b.o.ColdCap); time.Now().Before(deadline); {
		select {
		case g := <-cold:
			pr.ColdAfterCap = g.Time.Sub(d.start)
			logf("  the cold sync's transaction committed %s after exec, the daemon stopped", formatValue(pr.ColdAfterCap.Seconds(), unitSeconds))
		case <-time.After(time.Second):
		}
		if pids, err := nd.topo.Node.PIDs(); err == nil && len(pids) == 0 {
			break
		}
	}
	return pr, "", nil
}

// checkRules saves every table of ns (kept gzipped in dir in config mode) and checks, as the monitor did,
// that every Service's chain is reachable from KUBE-SERVICES. It returns the save and the rules walked
// before each reachable chain (see chainCosts), plus "#KUBE-SERVICES": the length of that chain.
func checkRules(ns *harness.NetNS, dir, mode string, chains []string, svcs []*service) (string, map[string]int, error) {
	saved, err := save(ns, "")
	if err != nil {
		return "", nil, err
	}
	if mode == modeConfig {
		if err := writeGzip(filepath.Join(dir, "iptables-save.txt.gz"), saved); err != nil {
			return "", nil, err
		}
	}
	nat := harness.ParseSave(saved)["nat"]
	if nat == nil {
		return "", nil, errors.New("no nat table after the cold sync")
	}
	costs := chainCosts(nat)
	for i, c := range chains {
		if _, ok := costs[c]; !ok {
			return "", nil, fmt.Errorf("%s of Service %s is not reachable from KUBE-SERVICES after the cold sync", c, svcs[i].Name)
		}
	}
	costs["#KUBE-SERVICES"] = len(rulesByChain(nat)["KUBE-SERVICES"])
	return saved, costs, nil
}

// wait waits for a background profile, if any.
func wait(ch chan error) error {
	if ch == nil {
		return nil
	}
	return <-ch
}

// wireSink makes pod 1 the home of every endpoint address: the whole sinkRange is local there (so its
// pod server, listening on the wildcard address, answers for any of them), and the node routes it to pod 1.
func (b *bench) wireSink(ctx context.Context, topo *harness.Topology) error {
	pod := topo.Pods[0]
	if err := topo.StartServers(ctx, []int{podPort}, nil); err != nil {
		return err
	}
	if _, err := pod.NS.IP(ctx, "route", "add", "local", sinkRange, "dev", "lo", "table", "local"); err != nil {
		return err
	}
	_, err := topo.Node.IP(ctx, "route", "add", sinkRange, "via", pod.IP, "dev", pod.NodeLink)
	return err
}

// errNotInTime is waitGen's error when the timeout passed first.
var errNotInTime = errors.New("not in the kernel in time")

// waitGen waits for a watched transaction, the daemon's exit, or timeout.
func waitGen(ctx context.Context, mon *Monitor, ch <-chan Gen, d *daemon, timeout time.Duration, what string) (Gen, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case g := <-ch:
		return g, nil
	case <-d.proc.Done():
		return Gen{}, d.alive()
	case <-mon.stopped:
		return Gen{}, fmt.Errorf("nf_tables monitor stopped: %v", mon.readErr)
	case <-t.C:
		return Gen{}, fmt.Errorf("%s %w (%v); %s log tail:\n%s", what, errNotInTime, timeout, d.impl, d.proc.LogTail(20))
	case <-ctx.Done():
		return Gen{}, ctx.Err()
	}
}

// changeLoop makes the single-Service changes, alternately adding an endpoint to a random Service and
// removing one of another random Service's endpoints, each time waiting until the kernel has it plus a
// gap. The sequence depends only on the seed, N, M and the run, so every implementation gets the same
// one. It returns the Services it touched.
func (b *bench) changeLoop(ctx context.Context, w *workload, dl dialect, mon *Monitor, d *daemon, res *RunResult, pr *PhaseResult) (map[int]bool, error) {
	n := res.N
	rng := rand.New(rand.NewPCG(b.o.Seed, uint64(n)<<20|uint64(res.M)<<8|uint64(res.Run)))
	jitter := rand.New(rand.NewPCG(b.o.Seed, 1))
	touched := map[int]bool{}
	var issued []time.Time
	cpu0, err := readCPU(d.proc.PID())
	if err != nil {
		return nil, err
	}
	start := time.Now()
	changes := b.o.changesFor(pr.proxy())
	for k := range changes {
		i := rng.IntN(n)
		for touched[i] && len(touched) < n {
			i = rng.IntN(n)
		}
		touched[i] = true
		s := w.svcs[i]
		ips := w.sliceIPs(i)
		var ep string
		added := k%2 == 0
		if added {
			extra := extraEndpoint(k / 2)
			ips, ep = append(ips, extra), hostPort(extra, podPort)
		} else {
			j := rng.IntN(len(ips))
			ep = hostPort(ips[j], podPort)
			ips = slices.Delete(ips, j, j+1)
		}
		landed := dl.landed(s, ips, ep, added)
		if err := dl.reload(mon, s); err != nil {
			return nil, err
		}
		if mon.Check(landed) {
			return nil, fmt.Errorf("change %d (%s): the kernel already shows it before the API write", k, s.Name)
		}
		ch := mon.Watch(landed)
		issued = append(issued, time.Now())
		returned, err := w.setEndpoints(ctx, i, ips)
		if err != nil {
			return nil, err
		}
		verb := "adding"
		if !added {
			verb = "removing"
		}
		g, err := waitGen(ctx, mon, ch, d, b.o.ChangeTimeout, fmt.Sprintf("change %d (%s endpoint %s of %s)", k, verb, ep, s.Name))
		if err != nil {
			return nil, err
		}
		lat := g.Time.Sub(returned)
		if lat < 0 {
			pr.Early++
			lat = 0
		}
		pr.Latencies = append(pr.Latencies, lat)
		time.Sleep(b.o.Gap + time.Duration(jitter.Int64N(int64(b.o.Gap/2)+1)))
	}
	end := time.Now()
	cpu1, err := readCPU(d.proc.PID())
	if err != nil {
		return nil, err
	}
	pr.LoopCPU, pr.LoopWall = cpu1.Sub(cpu0), end.Sub(start)
	pr.Changes = changes
	issued = append(issued, end)
	gens := mon.GensSince(issued[0])
	for k := 0; k+1 < len(issued); k++ {
		rules, elems, commits := 0, 0, 0
		for _, g := range gens {
			if !g.Time.Before(issued[k]) && g.Time.Before(issued[k+1]) {
				rules += g.Rules
				elems += g.Elems
				commits++
			}
		}
		pr.RulesPerChange = append(pr.RulesPerChange, rules)
		pr.ElemsPerChange = append(pr.ElemsPerChange, elems)
		pr.CommitsPerChange = append(pr.CommitsPerChange, commits)
	}
	logf("  %d changes: p50 %v p99 %v (CPU %v/change, %d rules written/change)", len(pr.Latencies),
		percentile(pr.Latencies, 0.5).Round(time.Millisecond), percentile(pr.Latencies, 0.99).Round(time.Millisecond),
		(pr.LoopCPU.Total() / time.Duration(max(1, changes))).Round(time.Millisecond), medianInt(pr.RulesPerChange))
	return touched, nil
}

// dataPlane waits until the Services the change loop touched are back in the kernel, reads where every
// Service sits in the nat table now (mode iptables: upstream rewrites KUBE-SERVICES in a new order at
// every sync), then times new connections from the client namespace to each target, into pr.
func (b *bench) dataPlane(ctx context.Context, w *workload, dl dialect, mon *Monitor, d *daemon, topo *harness.Topology, n int, touched map[int]bool, pr *PhaseResult) error {
	var back []*service
	for i := range touched {
		back = append(back, w.svcs[i])
	}
	restored := dl.restored(back)
	ch := mon.Watch(restored)
	if err := dl.reload(mon, back...); err != nil {
		return err
	}
	if !mon.Check(restored) {
		if _, err := waitGen(ctx, mon, ch, d, b.o.ChangeTimeout, "the changed Services' original endpoints"); err != nil {
			// Before failing, read the kernel again: the notifications may have misled the model.
			if !errors.Is(err, errNotInTime) {
				return err
			}
			if rerr := dl.reload(mon, back...); rerr != nil {
				return fmt.Errorf("%w; re-reading the kernel: %v", err, rerr)
			}
			var done int
			mon.Check(func(v View) bool { done = dl.programmed(v, back); return true })
			if done < len(back) {
				return fmt.Errorf("%d of %d Services restored as the kernel shows them: %w", done, len(back), err)
			}
			logf("  warning: the monitor did not see the changed Services restored, but the kernel shows them so")
			pr.RestoreUnseen = true
		}
	}
	time.Sleep(time.Second) // let the daemon finish what the restoring writes started (e.g. the other family)
	targets, costs, err := dl.targets(topo.Node, w.svcs[:n])
	if err != nil {
		return err
	}
	for i := range targets {
		targets[i].from = topo.Client
	}
	if dl.bareInLoop() {
		bare, err := b.bareNode(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = bare.Close() }()
		targets = append(targets, dpTarget{name: dpBare, addr: podAddr(), from: bare.Client})
	}
	var conns []connTarget
	for _, t := range targets {
		hits, err := harness.Hit(ctx, t.from, "tcp", t.addr.String(), 3)
		if err != nil {
			return err
		}
		if hits["pod1"] != 3 {
			return fmt.Errorf("%s %v does not answer: %s", t.name, t.addr, harness.FormatHits(hits))
		}
		conns = append(conns, connTarget{t.from, t.addr})
	}
	times, failed, err := connectRounds(conns, b.o.Connects, 20)
	if err != nil {
		return err
	}
	var after map[string]int
	if costs != nil {
		if _, after, err = dl.targets(topo.Node, w.svcs[:n]); err != nil {
			return err
		}
	}
	pr.DataPlane = map[string]DataPlaneResult{}
	for i, t := range targets {
		pr.DataPlaneMoved = pr.DataPlaneMoved || after[t.chain] != costs[t.chain]
		r := DataPlaneResult{Addr: t.addr.String(), RulesWalked: costs[t.chain], P50: percentile(times[i], 0.5),
			P90: percentile(times[i], 0.9), Samples: len(times[i]), Fail: failed[i]}
		pr.DataPlane[t.name] = r
		walked := ""
		if costs != nil {
			walked = fmt.Sprintf(" (%d rules walked)", r.RulesWalked)
		}
		logf("  new connections to %s %s%s: p50 %v p90 %v, %d failed", t.name, r.Addr, walked,
			r.P50.Round(time.Microsecond), r.P90.Round(time.Microsecond), r.Fail)
	}
	if pr.DataPlaneMoved {
		logf("  (the nat table was rewritten in another order during the measurement)")
	}
	return nil
}

// natCosts saves the nat table of ns and returns chainCosts of it, plus "#KUBE-SERVICES", that chain's
// length (what a connection to no Service walks).
func natCosts(ns *harness.NetNS) (map[string]int, error) {
	text, err := save(ns, "nat")
	if err != nil {
		return nil, err
	}
	nat := harness.ParseSave(text)["nat"]
	if nat == nil {
		return nil, errors.New("no nat table")
	}
	costs := chainCosts(nat)
	costs["#KUBE-SERVICES"] = len(rulesByChain(nat)["KUBE-SERVICES"])
	return costs, nil
}

// profile fetches a CPU profile of d in the background and saves its top
// functions (by cumulative time) next to it.
func (b *bench) profile(ctx context.Context, d *daemon, path string) chan error {
	done := make(chan error, 1)
	go func() {
		if err := d.fetchProfile(ctx, b.o.ProfileSeconds, path); err != nil {
			done <- fmt.Errorf("profiling %s: %w", d.impl, err)
			return
		}
		out, err := exec.Command("go", "tool", "pprof", "-top", "-cum", "-nodecount=40", path).CombinedOutput()
		if err == nil {
			_ = os.WriteFile(strings.TrimSuffix(path, ".pprof")+".top.txt", out, 0o644)
			logf("  profile saved: %s (top functions in %s)", path, strings.TrimSuffix(path, ".pprof")+".top.txt")
		}
		done <- nil
	}()
	return done
}

// writeJSON writes every result so far to results.json in the output directory.
func (b *bench) writeJSON() error {
	data, err := json.MarshalIndent(savedRun{b.o, b.machine, b.results}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(b.outdir, "results.json"), data, 0o644)
}

// writeGzip writes text gzip-compressed to path.
func writeGzip(path, text string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	zw := gzip.NewWriter(f)
	_, err = zw.Write([]byte(text))
	return errors.Join(err, zw.Close(), f.Close())
}

func logf(format string, a ...any) {
	fmt.Printf("%s %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, a...))
}
