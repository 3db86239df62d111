// Package daemon holds end-to-end tests of the kube-proxy process itself: start-up against a real API
// server, sd_notify, reloads, health and metrics, and shutdown.
package daemon

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"kube-proxy/e2e/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }

// waitLine waits for a notify line matching pred sent by pid, after index from; it returns the index
// after the match.
func waitLine(t *testing.T, d *harness.Daemon, from int, what string, pred func(string) bool) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	i, err := d.Notify.WaitForLine(ctx, from, pred)
	if err != nil {
		t.Fatalf("waiting for %s: %v (lines so far: %q)", what, err, d.Notify.Lines())
	}
	return i
}

func reloadStatus(t *testing.T, d *harness.Daemon) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(d.RuntimeDir, "reload-status"))
	if err != nil {
		t.Fatalf("reading reload status: %v", err)
	}
	return strings.TrimSpace(string(b))
}

// TestLifecycle starts the built binary as system:kube-proxy (RBAC system:node-proxier only) against the
// real apiserver and walks it through what systemd would do to it.
func TestLifecycle(t *testing.T) {
	c := harness.SharedCluster(t)
	harness.EnsureNode(t, c, "node-a", "192.0.2.10", "", nil)
	ns := harness.NetNSForTest(t, "life")
	start := time.Now()
	d := harness.StartDaemon(t, c, ns, harness.DaemonOptions{
		Config: "iptables:\n  syncPeriod: 30s\n  minSyncPeriod: 0s\n",
	})
	t.Logf("READY=1 %v after start", time.Since(start).Round(time.Millisecond))

	// READY=1 came with a readable status line.
	var status string
	for _, l := range d.Notify.Lines() {
		if strings.HasPrefix(l, "STATUS=") {
			status = l
		}
	}
	if !strings.Contains(status, "node node-a") {
		t.Errorf("status line %q does not describe the node", status)
	}

	// Health and metrics, with upstream's names and shapes.
	code, body, err := d.Get(10256, "/healthz")
	if err != nil || code != 200 {
		t.Fatalf("/healthz: %d %v %s", code, err, body)
	}
	var health map[string]any
	if err := json.Unmarshal([]byte(body), &health); err != nil {
		t.Fatalf("/healthz body %q: %v", body, err)
	}
	for _, k := range []string{"lastUpdated", "currentTime", "nodeEligible", "healthy"} {
		if _, ok := health[k]; !ok {
			t.Errorf("/healthz JSON lacks %q: %s", k, body)
		}
	}
	if code, _, err := d.Get(10256, "/livez"); err != nil || code != 200 {
		t.Errorf("/livez: %d %v", code, err)
	}
	metrics := d.Metrics()
	for _, m := range []string{
		"kubeproxy_sync_proxy_rules_duration_seconds_bucket",
		"kubeproxy_sync_proxy_rules_last_timestamp_seconds",
		"kubeproxy_sync_proxy_rules_endpoint_changes_total",
		"kubeproxy_sync_proxy_rules_service_changes_total",
		"go_goroutines",
		"process_resident_memory_bytes",
	} {
		if !strings.Contains(metrics, m) {
			t.Errorf("/metrics lacks %s", m)
		}
	}
	if code, body, _ := d.Get(10249, "/proxyMode"); code != 200 || body != "iptables" {
		t.Errorf("/proxyMode: %d %q", code, body)
	}

	// A valid reload: RELOADING=1 with MONOTONIC_USEC, then READY=1, and the outcome recorded.
	mark := len(d.Notify.Lines())
	d.WriteConfig("iptables:\n  syncPeriod: 20s\n  minSyncPeriod: 0s\nlogging:\n  verbosity: 3\n")
	if err := d.Proc.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	i := waitLine(t, d, mark, "RELOADING=1", func(l string) bool { return l == "RELOADING=1" })
	waitLine(t, d, i, "MONOTONIC_USEC", func(l string) bool { return strings.HasPrefix(l, "MONOTONIC_USEC=") })
	waitLine(t, d, i, "READY=1 after reload", func(l string) bool { return l == "READY=1" })
	waitFor(t, "reload status", func() bool {
		b, _ := os.ReadFile(filepath.Join(d.RuntimeDir, "reload-status"))
		return strings.HasPrefix(string(b), "1 applied")
	})
	if code, body, _ := d.Get(10249, "/configz"); code != 200 || !strings.Contains(body, `"syncPeriod":"20s"`) {
		t.Errorf("/configz after reload does not show syncPeriod 20s: %d %s", code, body)
	}

	// The ExecReload helper waits for the outcome and fails on a refused config; the daemon keeps running.
	bin, _ := harness.DaemonBinary()
	helper := func() error {
		cmd := exec.Command(bin, "reload", itoa(d.Proc.PID()))
		cmd.Env = append(os.Environ(), "RUNTIME_DIRECTORY="+d.RuntimeDir)
		out, err := cmd.CombinedOutput()
		t.Logf("kube-proxy reload: %s", strings.TrimSpace(string(out)))
		return err
	}
	if err := helper(); err != nil {
		t.Errorf("reload helper with an unchanged valid file failed: %v", err)
	}
	d.WriteRawConfig("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\niptables:\n  syncPeriod: soon\n")
	if err := helper(); err == nil {
		t.Errorf("reload helper accepted an invalid file")
	}
	if st := reloadStatus(t, d); !strings.Contains(st, "invalid") || !strings.Contains(st, "iptables.syncPeriod") {
		t.Errorf("reload status %q does not name the invalid field", st)
	}
	// A field that needs a restart is refused as such.
	d.WriteConfig("mode: ipvs\n")
	if err := helper(); err == nil {
		t.Errorf("reload helper accepted a mode change")
	}
	if st := reloadStatus(t, d); !strings.Contains(st, "restart-required") || !strings.Contains(st, "mode") {
		t.Errorf("reload status %q does not say mode needs a restart", st)
	}
	if d.Proc.Exited() {
		t.Fatalf("daemon exited after a refused reload: %v", d.Proc.ExitErr())
	}
	if code, _, _ := d.Get(10256, "/healthz"); code != 200 {
		t.Errorf("/healthz after refused reloads: %d", code)
	}
	metrics = d.Metrics()
	for _, want := range []string{`kubeproxy_config_reloads_total{result="applied"} 2`, `kubeproxy_config_reloads_total{result="invalid"} 1`,
		`kubeproxy_config_reloads_total{result="restart-required"} 1`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	// SIGTERM: STOPPING=1 and a clean exit within 2 s; the rules stay.
	mark = len(d.Notify.Lines())
	stopStart := time.Now()
	if err := d.Proc.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.Proc.Done():
	case <-time.After(2 * time.Second):
		t.Fatalf("daemon still running 2 s after SIGTERM")
	}
	t.Logf("stopped %v after SIGTERM", time.Since(stopStart).Round(time.Millisecond))
	if err := d.Proc.ExitErr(); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
	waitLine(t, d, mark, "STOPPING=1", func(l string) bool { return l == "STOPPING=1" })
	out, err := ns.Run(context.Background(), "iptables-save", "-t", "nat")
	if err != nil || !strings.Contains(out, ":KUBE-SERVICES") {
		t.Errorf("rules gone after stop: %v\n%s", err, out)
	}
}

// TestAPIServerUnreachableAtStart: with nothing listening where the kubeconfig points, the daemon says so,
// keeps retrying without crashing, and becomes ready once the API server is reachable.
func TestAPIServerUnreachableAtStart(t *testing.T) {
	c := harness.SharedCluster(t)
	harness.EnsureNode(t, c, "node-b", "192.0.2.11", "", nil)
	ns := harness.NetNSForTest(t, "noapi")
	kubeconfig, err := c.Kubeconfig(harness.UserKubeProxy, "https://"+harness.BridgeAddr)
	if err != nil {
		t.Fatal(err)
	}
	d := harness.StartDaemon(t, c, ns, harness.DaemonOptions{NodeName: "node-b", Kubeconfig: kubeconfig, NoWaitReady: true})
	time.Sleep(4 * time.Second)
	if d.Proc.Exited() {
		t.Fatalf("daemon exited while the API server was unreachable: %v\n%s", d.Proc.ExitErr(), d.Proc.LogTail(30))
	}
	log := d.Proc.Log()
	if !strings.Contains(log, "connection refused") {
		t.Errorf("log does not say the API server is unreachable:\n%s", d.Proc.LogTail(30))
	}
	for _, l := range d.Notify.Lines() {
		if l == "READY=1" {
			t.Fatalf("READY=1 before the API server was reachable")
		}
	}
	if code, _, err := d.Get(10256, "/livez"); err != nil || code != 200 {
		t.Errorf("/livez while waiting for the API server: %d %v", code, err)
	}
	_, stop, err := c.Bridge(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	d.WaitReady(90 * time.Second)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
