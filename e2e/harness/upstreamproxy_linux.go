package harness

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// UpstreamOptions configure an upstream kube-proxy started by StartUpstream.
type UpstreamOptions struct {
	// NodeName is hostnameOverride (default "node-a").
	NodeName string
	// Config is extra YAML appended to the generated KubeProxyConfiguration (see ConfigYAML), e.g.
	// "mode: iptables\nclusterCIDR: 10.244.0.0/16\n".
	Config string
	// Kubeconfig is the in-namespace kubeconfig; empty bridges the cluster into the namespace.
	Kubeconfig string
	// Env is extra environment.
	Env []string
}

// Upstream is upstream kube-proxy (the binary BinDir holds, built by e2e/tools/build-cluster.sh) running
// inside a network namespace.
type Upstream struct {
	NS         *NetNS
	Proc       *Process
	ConfigPath string
	Kubeconfig string
}

// StartUpstream starts upstream kube-proxy in ns with a generated configuration (healthz on
// 127.0.0.1:10256 and metrics on 127.0.0.1:10249 inside ns) and waits until its /healthz answers 200.
// That shows it is up, not that it has synced: upstream reports healthy while starting, and syncs each IP
// family on its own, so wait for the rules you need as well. It is stopped (SIGTERM, then SIGKILL) at test
// cleanup; on exit upstream leaves its rules in place, as ours does.
func StartUpstream(t testing.TB, c *Cluster, ns *NetNS, opts UpstreamOptions) *Upstream {
	t.Helper()
	dir, err := BinDir()
	if err != nil {
		t.Fatal(err)
	}
	if opts.NodeName == "" {
		opts.NodeName = "node-a"
	}
	u := &Upstream{NS: ns, Kubeconfig: opts.Kubeconfig}
	if u.Kubeconfig == "" {
		u.Kubeconfig = c.BridgeForTest(t, ns)
	}
	tmp := t.TempDir()
	u.ConfigPath = filepath.Join(tmp, "upstream-kube-proxy.yaml")
	if err := os.WriteFile(u.ConfigPath, []byte(ConfigYAML(u.Kubeconfig, opts.NodeName, opts.Config)), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := ns.Command(context.Background(), filepath.Join(dir, "kube-proxy"), "--config="+u.ConfigPath, "--v=2")
	cmd.Env = append(os.Environ(), opts.Env...)
	proc, err := StartProcess("upstream kube-proxy", cmd, filepath.Join(tmp, "upstream-kube-proxy.log"))
	if err != nil {
		t.Fatal(err)
	}
	u.Proc = proc
	t.Cleanup(func() {
		if err := proc.Stop(syscall.SIGTERM, 10*time.Second); err != nil {
			t.Errorf("stopping upstream kube-proxy: %v", err)
		}
		if t.Failed() {
			t.Logf("upstream kube-proxy log tail:\n%s", proc.LogTail(40))
		}
	})
	if err := u.WaitHealthy(90 * time.Second); err != nil {
		t.Fatal(err)
	}
	return u
}

// WaitHealthy polls upstream's /healthz inside its namespace until it answers 200.
func (u *Upstream) WaitHealthy(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	client := u.NS.HTTPClient()
	client.Timeout = 2 * time.Second
	for {
		resp, err := client.Get("http://127.0.0.1:10256/healthz")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if u.Proc.Exited() {
			return fmt.Errorf("upstream kube-proxy exited before it was healthy: %v\n%s", u.Proc.ExitErr(), u.Proc.LogTail(40))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("upstream kube-proxy not healthy within %v (last error %v)\n%s", timeout, err, u.Proc.LogTail(40))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
