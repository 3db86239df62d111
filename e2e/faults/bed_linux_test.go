package faults

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"kube-proxy/e2e/harness"
	"kube-proxy/e2e/probe"
)

func TestMain(m *testing.M) { harness.Main(m) }

// modes are the modes every row is measured in (mode ipvs runs for real only in the qemu VM).
var modes = []string{"iptables", "nftables"}

// syncPeriod of the fault beds: short enough for the short form, the default in the long one.
var syncPeriod = Pick(5*time.Second, 30*time.Second)

// The pod and Service ports of the bed (harness.WebPorts), short.
const svcTCP = harness.ServiceTCPPort

// bed is one fault test's world in one mode: a harness.Bed (node namespace with 3 pods, a client, a
// Kubernetes namespace) and, for mode iptables, a private xtables lock and backend hint.
type bed struct {
	*harness.Bed
	t    *testing.T
	mode string
	xt   *harness.XTables
	d    *harness.Daemon
}

func newBed(t *testing.T, mode string) *bed { return newBedWith(t, mode, harness.BackendNFT) }

// newBedWith is newBed with the iptables backend the daemon is steered to (only iptables-legacy takes
// the xtables lock).
func newBedWith(t *testing.T, mode, backend string) *bed {
	t.Helper()
	b := &bed{t: t, mode: mode, Bed: harness.NewBed(t, harness.BedOptions{Pods: 3, Prefix: "fault",
		Tools: []string{"iptables-nft", "iptables-nft-save", "iptables-legacy", "nft", "flock"}})}
	xt, err := harness.NewXTables(b.Topo.Node, backend, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b.xt = xt
	ctx, cancel := b.Ctx()
	defer cancel()
	if err := xt.SetHint(ctx); err != nil {
		t.Fatal(err)
	}
	return b
}

// config is the daemon configuration of the bed's mode, with extra appended.
func (b *bed) config(extra string) string {
	section := "iptables"
	if b.mode == "nftables" {
		section = "nftables"
	}
	return fmt.Sprintf("mode: %s\nclusterCIDR: %s\n%s:\n  syncPeriod: %s\n  minSyncPeriod: 0s\n%s",
		b.mode, harness.PodCIDR, section, syncPeriod, extra)
}

// start starts the daemon (opts.Binary, Env and Config extra as given) and waits for READY=1 unless
// opts.NoWaitReady.
func (b *bed) start(opts harness.DaemonOptions) *harness.Daemon {
	b.t.Helper()
	opts.NodeName = b.Node
	opts.Kubeconfig = b.Kubeconfig
	opts.Config = b.config(opts.Config)
	opts.Env = append(opts.Env, b.xt.Env())
	b.d = harness.StartDaemon(b.t, b.Cluster, b.Topo.Node, opts)
	return b.d
}

// web creates Service web with pods 1-3 behind it and returns its cluster IP target and NodePort target.
func (b *bed) web() []harness.Target {
	b.t.Helper()
	web := b.CreateService(b.t, "web", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort })
	b.SetEndpoints(b.t, "web", harness.ReadyEndpoint(1), harness.ReadyEndpoint(2), harness.ReadyEndpoint(3))
	return []harness.Target{
		{Network: "tcp", Addr: harness.HostPort(web.Spec.ClusterIP, svcTCP)},
		{Network: "tcp", Addr: harness.HostPort(harness.NodeIP, harness.NodePortOf(b.t, web, "tcp"))},
	}
}

// expectNoFailures fails t when connections to existing Services failed during a fault. Isolated timeouts
// at the host's floor (package kube-proxy/e2e/floor: at most one per ten thousand connections, rounded
// up, none within 50 connections of another) are logged rather than failed: the baseline row
// (TestBaseline: the same traffic, no fault) shows that floor on a loaded two-core machine with a 2 s dial
// timeout; the rows still count them. Any refusal or reset, or more timeouts, fails.
func expectNoFailures(t *testing.T, what string, res []harness.HitResult) {
	t.Helper()
	n := probe.Failures(res)
	if n == 0 {
		return
	}
	if probe.WithinFloor(res) {
		t.Logf("%s: %d of %d connections timed out (within the baseline's floor): %s", what, n, len(res), failed(res))
		return
	}
	t.Errorf("%s: %d of %d connections failed: %s", what, n, len(res), failed(res))
}

// failed describes the failed connections of a traffic run, for a test's error.
func failed(res []harness.HitResult) string {
	var out []string
	for _, r := range res {
		if r.Err != "" && len(out) < 5 {
			out = append(out, r.Err+": "+r.Detail)
		}
	}
	return strings.Join(out, "; ")
}

// reachable polls addr from the client until one connection succeeds, and returns how long it took.
func (b *bed) reachable(addr string, limit time.Duration) (time.Duration, error) {
	took, err := probe.Reachable(limit, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		res, _ := harness.HitWith(ctx, b.Topo.Client, "tcp", addr, 1, harness.HitOptions{Timeout: 500 * time.Millisecond})
		if len(res) == 1 && res[0].Err == "" {
			return nil
		}
		return errors.New("no answer")
	})
	if err != nil {
		return took, fmt.Errorf("%s not reachable within %v", addr, limit)
	}
	return took, nil
}

// observation is what a fault row watches while the fault lasts: connections to the bed's Services and the
// daemon's /healthz, polled every second (probe.NoAnswer when it does not answer within 5 s).
type observation struct {
	tr    *harness.Traffic
	stop  chan struct{}
	codes <-chan map[int]int
}

// observe starts traffic to targets (and waits for its first 20 connections) and the health probe.
func (b *bed) observe(d *harness.Daemon, targets []harness.Target) *observation {
	b.t.Helper()
	o := &observation{tr: harness.StartTraffic(b.Topo.Client, targets), stop: make(chan struct{})}
	o.tr.WaitFor(b.t, 20)
	o.codes = probe.PollCodes(func() int {
		return probe.StatusCode(d.NS.HTTPClient(), "http://127.0.0.1:10256/healthz", 5*time.Second)
	}, time.Second, o.stop)
	return o
}

// end stops both and returns the connections made and the health codes seen.
func (o *observation) end() ([]harness.HitResult, map[int]int) {
	close(o.stop)
	codes := <-o.codes
	return o.tr.Stop(), codes
}

// change creates Service name with pod behind it (a change for the daemon to apply) and returns a func
// that waits until the Service answers and says how long that took from since.
func (b *bed) change(name string, pod int) func(since time.Time) time.Duration {
	b.t.Helper()
	svc := b.CreateService(b.t, name, nil)
	b.SetEndpoints(b.t, name, harness.ReadyEndpoint(pod))
	return func(since time.Time) time.Duration {
		b.t.Helper()
		if _, err := b.reachable(harness.HostPort(svc.Spec.ClusterIP, svcTCP), time.Minute); err != nil {
			b.t.Error(err)
		}
		return time.Since(since)
	}
}

// lastStatus returns the last STATUS= line the daemon (its current process) sent to its notify socket.
func lastStatus(d *harness.Daemon) string {
	var texts []string
	for _, m := range d.Notify.Received() {
		if m.PID == d.Proc.PID() {
			texts = append(texts, m.Text)
		}
	}
	return probe.LastStatus(texts)
}

// record adds a row, failing the test if it cannot be written.
func record(t *testing.T, r Row) {
	t.Helper()
	t.Logf("row: %s | %s | sent %d, failed %d | converge %s | %s", r.Fault, r.Mode, r.Sent, r.Failed, r.Converge, r.Sees)
	if err := Record(r); err != nil {
		t.Fatal(err)
	}
}

// alive fails the test if the daemon exited or was restarted (its PID changed).
func alive(t *testing.T, d *harness.Daemon, pid int, when string) {
	t.Helper()
	if d.Proc.Exited() || d.Proc.PID() != pid {
		t.Errorf("%s: the daemon exited (%v)", when, d.Proc.ExitErr())
	}
}

// hold takes the bed's xtables lock with flock for d, in the background; the returned func waits for
// the release.
func (b *bed) holdLock(d time.Duration) (release func()) {
	b.t.Helper()
	dir := b.t.TempDir()
	held := dir + "/held"
	cmd := b.Topo.Node.Command(context.Background(), "flock", "-x", b.xt.LockFile, "sh", "-c",
		fmt.Sprintf("touch %s; sleep %d", held, int(d.Seconds())))
	proc, err := harness.StartProcess("flock holder", cmd, dir+"/flock.log")
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { _ = proc.Stop(syscall.SIGTERM, 5*time.Second) })
	harness.Eventually(b.t, "the lock to be held", 10*time.Second, func() (bool, string) {
		_, err := os.Stat(held)
		return err == nil, "not yet"
	})
	return func() { <-proc.Done() }
}
