package harness

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kube-proxy/e2e/probe"
)

// EnvBinary names the kube-proxy binary under test (make sets it to bin/kube-proxy); without it the
// harness builds one.
const EnvBinary = "KP_BINARY"

// EnvFaultsBinary names the binary built with the faultinject tag (make build-faults).
const EnvFaultsBinary = "KP_FAULTS_BINARY"

var daemonBinary struct {
	once sync.Once
	path string
	err  error
}

// DaemonBinary returns the kube-proxy binary under test: $KP_BINARY, or one built from this module on
// first use (CGO_ENABLED=0, like a release build).
func DaemonBinary() (string, error) {
	daemonBinary.once.Do(func() {
		if p := os.Getenv(EnvBinary); p != "" {
			if _, err := os.Stat(p); err != nil {
				daemonBinary.err = fmt.Errorf("%s=%s: %w", EnvBinary, p, err)
				return
			}
			daemonBinary.path = p
			return
		}
		root, err := moduleRoot()
		if err != nil {
			daemonBinary.err = err
			return
		}
		out := filepath.Join(filepath.Dir(DefaultBinDir()), "kube-proxy-under-test")
		cmd := exec.Command("go", "build", "-buildvcs=false", "-o", out, ".")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			daemonBinary.err = fmt.Errorf("building kube-proxy: %w: %s", err, strings.TrimSpace(string(b)))
			return
		}
		daemonBinary.path = out
	})
	return daemonBinary.path, daemonBinary.err
}

// DaemonOptions configure a kube-proxy started by StartDaemon.
type DaemonOptions struct {
	// Binary is the executable; empty means DaemonBinary().
	Binary string
	// NodeName is hostnameOverride (default "node-a").
	NodeName string
	// Config is extra YAML appended to the generated KubeProxyConfiguration (top-level fields, e.g.
	// "mode: iptables\nclusterCIDR: 10.244.0.0/16\n"). The generated part sets clientConnection, the
	// node name, health and metrics on 127.0.0.1, and leaves global conntrack sysctls alone.
	Config string
	// Args are extra command-line flags.
	Args []string
	// Env is extra environment.
	Env []string
	// NoWaitReady returns right after the start instead of waiting for READY=1.
	NoWaitReady bool
	// Kubeconfig overrides the bridged kubeconfig (e.g. to point at an unreachable server).
	Kubeconfig string
}

// Daemon is a kube-proxy process running inside a network namespace, with its notify socket, runtime
// directory and config file.
type Daemon struct {
	NS         *NetNS
	Proc       *Process
	Notify     *NotifySocket
	Dir        string
	ConfigPath string
	RuntimeDir string
	Kubeconfig string
	opts       DaemonOptions
	t          testing.TB // set by StartDaemon, for the methods that fail the test
}

// ConfigYAML renders the daemon's configuration file for a kubeconfig path, node name and extra YAML.
func ConfigYAML(kubeconfig, nodeName, extra string) string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %s
hostnameOverride: %s
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
conntrack:
  maxPerCore: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
%s`, kubeconfig, nodeName, extra)
}

// StartDaemon writes a config, bridges the cluster into ns (unless opts.Kubeconfig is set) and starts
// kube-proxy in ns with NOTIFY_SOCKET and RUNTIME_DIRECTORY set as systemd would; it waits for READY=1
// unless opts.NoWaitReady. The process is stopped (SIGTERM, then SIGKILL) at test cleanup.
func StartDaemon(t testing.TB, c *Cluster, ns *NetNS, opts DaemonOptions) *Daemon {
	t.Helper()
	if opts.Kubeconfig == "" {
		opts.Kubeconfig = c.BridgeForTest(t, ns)
	}
	d, err := LaunchDaemon(ns, t.TempDir(), opts)
	if d != nil {
		d.t = t
		t.Cleanup(func() {
			if t.Failed() && d.Proc != nil {
				t.Logf("kube-proxy log tail:\n%s", d.Proc.LogTail(60))
			}
			d.Close()
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// LaunchDaemon is StartDaemon without a testing.TB: opts.Kubeconfig must be set (see Cluster.Bridge), dir
// holds the config, logs and runtime directory, and the caller calls Close.
func LaunchDaemon(ns *NetNS, dir string, opts DaemonOptions) (*Daemon, error) {
	if opts.NodeName == "" {
		opts.NodeName = "node-a"
	}
	if opts.Binary == "" {
		bin, err := DaemonBinary()
		if err != nil {
			return nil, err
		}
		opts.Binary = bin
	}
	d := &Daemon{NS: ns, Dir: dir, ConfigPath: filepath.Join(dir, "kube-proxy-config.yaml"),
		RuntimeDir: filepath.Join(dir, "run"), Kubeconfig: opts.Kubeconfig, opts: opts}
	if err := os.MkdirAll(d.RuntimeDir, 0o755); err != nil {
		return nil, err
	}
	if err := d.writeRawConfig(ConfigYAML(d.Kubeconfig, opts.NodeName, opts.Config)); err != nil {
		return nil, err
	}
	notify, err := NewNotifySocket(dir)
	if err != nil {
		return nil, err
	}
	d.Notify = notify
	if err := d.launch(); err != nil {
		return d, err
	}
	if !opts.NoWaitReady {
		return d, d.waitReady(60 * time.Second)
	}
	return d, nil
}

// Close stops the process (SIGTERM, then SIGKILL after 5 s) and closes the notify socket.
func (d *Daemon) Close() {
	if d.Proc != nil && !d.Proc.Exited() {
		_ = d.Proc.Stop(syscall.SIGTERM, 5*time.Second)
	}
	if d.Notify != nil {
		_ = d.Notify.Close()
	}
}

// Start (re)starts the daemon process with the current config file and waits for READY=1 unless the
// daemon was created with NoWaitReady.
func (d *Daemon) Start() {
	d.t.Helper()
	if err := d.launch(); err != nil {
		d.t.Fatal(err)
	}
	proc := d.Proc
	d.t.Cleanup(func() {
		if !proc.Exited() {
			_ = proc.Stop(syscall.SIGTERM, 5*time.Second)
		}
	})
	if !d.opts.NoWaitReady {
		d.WaitReady(60 * time.Second)
	}
}

func (d *Daemon) launch() error {
	args := append([]string{"--config=" + d.ConfigPath, "--v=2"}, d.opts.Args...)
	cmd := d.NS.Command(context.Background(), d.opts.Binary, args...)
	cmd.Env = append(os.Environ(), d.Notify.Env(), "RUNTIME_DIRECTORY="+d.RuntimeDir)
	cmd.Env = append(cmd.Env, d.opts.Env...)
	proc, err := StartProcess("kube-proxy", cmd, filepath.Join(d.Dir, "kube-proxy.log"))
	if err != nil {
		return err
	}
	d.Proc = proc
	return nil
}

// WaitReady waits for a READY=1 from the current process.
func (d *Daemon) WaitReady(timeout time.Duration) {
	d.t.Helper()
	if err := d.waitReady(timeout); err != nil {
		d.t.Fatal(err)
	}
}

func (d *Daemon) waitReady(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	pid := d.Proc.PID()
	for {
		for _, m := range d.Notify.Received() {
			if m.PID == pid && strings.Contains("\n"+m.Text+"\n", "\nREADY=1\n") {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kube-proxy sent no READY=1 within %v; log:\n%s", timeout, d.Proc.LogTail(40))
		case <-d.Proc.Done():
			return fmt.Errorf("kube-proxy exited before READY=1: %v; log:\n%s", d.Proc.ExitErr(), d.Proc.LogTail(40))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// WriteConfig rewrites the config file with the generated part plus extra.
func (d *Daemon) WriteConfig(extra string) {
	d.t.Helper()
	d.WriteRawConfig(ConfigYAML(d.Kubeconfig, d.opts.NodeName, extra))
}

// WriteRawConfig writes the config file verbatim.
func (d *Daemon) WriteRawConfig(body string) {
	d.t.Helper()
	if err := d.writeRawConfig(body); err != nil {
		d.t.Fatal(err)
	}
}

func (d *Daemon) writeRawConfig(body string) error {
	return os.WriteFile(d.ConfigPath, []byte(body), 0o644)
}

// Get fetches http://127.0.0.1<path> on port from inside the daemon's namespace.
func (d *Daemon) Get(port int, path string) (int, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return probe.Get(ctx, d.NS.HTTPClient(), fmt.Sprintf("http://127.0.0.1:%d%s", port, path))
}

// Metrics returns the daemon's /metrics text.
func (d *Daemon) Metrics() string {
	d.t.Helper()
	code, body, err := d.Get(10249, "/metrics")
	if err != nil || code != 200 {
		d.t.Fatalf("GET /metrics: %d %v", code, err)
	}
	return body
}

// EnsureNode creates (or updates) a Node object as a kubelet would, with the given InternalIP and pod CIDR
// (either may be empty).
func EnsureNode(t testing.TB, c *Cluster, name, internalIP, podCIDR string, labels map[string]string) {
	t.Helper()
	if err := ApplyNode(context.Background(), c, name, internalIP, podCIDR, labels); err != nil {
		t.Fatal(err)
	}
}

// ApplyNode is EnsureNode without a testing.TB.
func ApplyNode(ctx context.Context, c *Cluster, name, internalIP, podCIDR string, labels map[string]string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	if podCIDR != "" {
		node.Spec.PodCIDR = podCIDR
		node.Spec.PodCIDRs = []string{podCIDR}
	}
	created, err := c.Admin.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		created, err = c.Admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			created.Labels = labels
			created.Spec.PodCIDR, created.Spec.PodCIDRs = node.Spec.PodCIDR, node.Spec.PodCIDRs
			created, err = c.Admin.CoreV1().Nodes().Update(ctx, created, metav1.UpdateOptions{})
		}
	}
	if err != nil {
		return fmt.Errorf("node %s: %w", name, err)
	}
	if internalIP != "" {
		created.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: internalIP}}
		if _, err := c.Admin.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("node %s status: %w", name, err)
		}
	}
	return nil
}
