package systemdlab

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"kube-proxy/e2e/harness"
)

func TestMain(m *testing.M) {
	harness.Main(m)
	if artifacts.dir != "" {
		_ = os.RemoveAll(artifacts.dir)
	}
}

// labTools are the host commands the lab needs besides the harness's.
var labTools = []string{"systemd-nspawn", "debootstrap", "nsenter", "dpkg-deb", "tar", "flock"}

// repoRoot is the repository, two levels up from this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// requireLab skips without KP_E2E and fails when the lab cannot run; it returns the shared cluster.
func requireLab(t *testing.T) *harness.Cluster {
	t.Helper()
	harness.RequireCluster(t, labTools...)
	return harness.SharedCluster(t)
}

// ensureRootfs builds (once per machine) the suite's root file system.
func ensureRootfs(t *testing.T, suite Suite) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	if _, err := EnsureRootfs(ctx, suite.Name); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Logf("built the %s rootfs in %v (cached in %s from now on)", suite.Name, d.Round(time.Second), RootfsDir(suite.Name))
	}
}

// artifacts are built once per test binary and shared by the tests.
var artifacts struct {
	once    sync.Once
	err     error
	dir     string
	binary  string // the release build under test
	faults  string // the faultinject build
	tarball string
}

// buildArtifacts returns the binary under test (KP_BINARY or built), the faults binary (KP_FAULTS_BINARY or
// built) and a release tarball made from the binary by packaging/tarball.sh.
func buildArtifacts(t *testing.T) {
	t.Helper()
	artifacts.once.Do(func() {
		root := repoRoot(t)
		artifacts.dir, artifacts.err = os.MkdirTemp("", "kplab-artifacts-")
		if artifacts.err != nil {
			return
		}
		if artifacts.binary, artifacts.err = harness.DaemonBinary(); artifacts.err != nil {
			return
		}
		artifacts.faults = os.Getenv(harness.EnvFaultsBinary)
		if artifacts.faults == "" {
			artifacts.faults = filepath.Join(artifacts.dir, "kube-proxy-faults")
			cmd := exec.Command("go", "build", "-tags", "faultinject", "-buildvcs=false", "-o", artifacts.faults, ".")
			cmd.Dir = root
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				artifacts.err = fmt.Errorf("building the faults binary: %w: %s", err, out)
				return
			}
		}
		out, err := exec.Command(filepath.Join(root, "packaging/tarball.sh"), artifacts.binary, runtime.GOARCH,
			"v0.0.0-lab", artifacts.dir).CombinedOutput()
		if err != nil {
			artifacts.err = fmt.Errorf("packaging/tarball.sh: %w: %s", err, out)
			return
		}
		artifacts.tarball = strings.TrimSpace(string(out))
	})
	if artifacts.err != nil {
		t.Fatal(artifacts.err)
	}
}

// lab is one booted machine with the test cluster's API server reachable inside at 127.0.0.1:6443.
type lab struct {
	t       *testing.T
	c       *harness.Cluster
	m       *Machine
	suite   Suite
	dir     string // host directory bound read-only at /lab
	console string
}

// newLab boots a machine of the suite whose /lab holds the unpacked release tarball (the guide's working
// directory) and kube-proxy.kubeconfig, and bridges the API server into it. Everything is torn down when t
// ends; on failure the machine's kube-proxy journal and console tail are logged first.
func newLab(t *testing.T, c *harness.Cluster, suite Suite) *lab {
	t.Helper()
	buildArtifacts(t)
	l := &lab{t: t, c: c, suite: suite, dir: t.TempDir()}
	l.console = filepath.Join(t.TempDir(), "console.log")
	if out, err := exec.Command("tar", "-xzf", artifacts.tarball, "--strip-components=1", "-C", l.dir).CombinedOutput(); err != nil {
		t.Fatalf("unpacking %s: %v: %s", artifacts.tarball, err, out)
	}
	l.writeKubeconfig(filepath.Join(l.dir, "kube-proxy.kubeconfig"))

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	m, err := Boot(ctx, BootOptions{Suite: suite.Name, LabDir: l.dir, ConsoleLog: l.console})
	if err != nil {
		t.Fatalf("booting %s: %v", suite.Name, err)
	}
	l.m = m
	t.Cleanup(func() {
		if t.Failed() {
			if r, err := m.Run(context.Background(), "journalctl -u kube-proxy --no-pager -n 80 -o short-monotonic"); err == nil {
				t.Logf("kube-proxy journal in %s:\n%s", m.Name, r.Out)
			}
			t.Logf("console tail:\n%s", m.ConsoleTail(l.console, 15))
		}
		if err := m.Shutdown(); err != nil {
			t.Errorf("shutting down %s: %v", m.Name, err)
		}
	})
	_, stop, err := c.BridgeAt(m.NS, harness.BridgeAddr, harness.UserKubeProxy)
	if err != nil {
		t.Fatalf("bridging the API server into %s: %v", m.Name, err)
	}
	t.Cleanup(stop)
	out := l.must("systemctl --version | head -n 1")
	t.Logf("%s booted in %v: %s", suite.Name, m.BootTime.Round(time.Millisecond), strings.TrimSpace(out))
	if !strings.HasPrefix(out, fmt.Sprintf("systemd %d ", suite.Systemd)) {
		t.Fatalf("%s runs %q, want systemd %d", suite.Name, strings.TrimSpace(out), suite.Systemd)
	}
	return l
}

// writeKubeconfig writes a self-contained kubeconfig (certificates embedded) for system:kube-proxy at
// https://127.0.0.1:6443, the bridge's address inside the machine: what an admin would hand to a node.
func (l *lab) writeKubeconfig(path string) {
	l.t.Helper()
	certFile, keyFile, err := l.c.ClientCert(harness.UserKubeProxy)
	if err != nil {
		l.t.Fatal(err)
	}
	read := func(p string) []byte {
		b, err := os.ReadFile(p)
		if err != nil {
			l.t.Fatal(err)
		}
		return b
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["lab"] = &clientcmdapi.Cluster{Server: "https://" + harness.BridgeAddr, CertificateAuthorityData: read(l.c.CAFile)}
	cfg.AuthInfos["system:kube-proxy"] = &clientcmdapi.AuthInfo{ClientCertificateData: read(certFile), ClientKeyData: read(keyFile)}
	cfg.Contexts["default"] = &clientcmdapi.Context{Cluster: "lab", AuthInfo: "system:kube-proxy"}
	cfg.CurrentContext = "default"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		l.t.Fatal(err)
	}
}

// copyIn puts a host file into /lab under name.
func (l *lab) copyIn(src, name string, mode os.FileMode) {
	l.t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		l.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(l.dir, name), b, mode); err != nil {
		l.t.Fatal(err)
	}
}

// writeLabFile writes a file into /lab (read-only inside the machine; written from the host).
func (l *lab) writeLabFile(name, content string) {
	l.t.Helper()
	if err := os.WriteFile(filepath.Join(l.dir, name), []byte(content), 0o644); err != nil {
		l.t.Fatal(err)
	}
}

// run runs script inside the machine; only a failure to run it at all fails the test.
func (l *lab) run(script string) Result {
	l.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r, err := l.m.Run(ctx, script)
	if err != nil {
		l.t.Fatal(err)
	}
	return r
}

// must runs script and fails the test unless it exits 0; it returns the output.
func (l *lab) must(script string) string {
	l.t.Helper()
	r := l.run(script)
	if r.Code != 0 {
		l.t.Fatalf("in %s: %q exited %d:\n%s", l.suite.Name, script, r.Code, r.Out)
	}
	return r.Out
}

// prop is `systemctl show -P NAME kube-proxy`.
func (l *lab) prop(name string) string {
	l.t.Helper()
	return strings.TrimSpace(l.must("systemctl show -P " + name + " kube-proxy"))
}

// props returns several unit properties at once.
func (l *lab) props(names ...string) map[string]string {
	l.t.Helper()
	out := l.must("systemctl show kube-proxy -p " + strings.Join(names, ","))
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			got[k] = v
		}
	}
	return got
}

// wantProps fails the test unless the unit's properties have the given values. It returns them, and
// MainPID.
func (l *lab) wantProps(when string, want map[string]string) map[string]string {
	l.t.Helper()
	names := []string{"MainPID"}
	for k := range want {
		names = append(names, k)
	}
	got := l.props(names...)
	for k, v := range want {
		if got[k] != v {
			l.t.Errorf("%s: %s=%q, want %q", when, k, got[k], v)
		}
	}
	return got
}

// waitFor polls cond every 100 ms until it is true or timeout passes, and returns how long it took.
func (l *lab) waitFor(what string, timeout time.Duration, cond func() bool) time.Duration {
	l.t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > timeout {
			l.t.Fatalf("in %s: %s: not within %v", l.suite.Name, what, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return time.Since(start)
}

// get fetches http://127.0.0.1:PORT/PATH inside the machine's network namespace.
func (l *lab) get(port int, path string) (int, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d%s", port, path), nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := l.m.NS.HTTPClient().Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// configz returns the configuration in force, from the daemon's /configz on the metrics port.
func (l *lab) configz(port int) map[string]any {
	l.t.Helper()
	code, body, err := l.get(port, "/configz")
	if err != nil || code != http.StatusOK {
		l.t.Fatalf("GET /configz on :%d: %d %v %s", port, code, err, body)
	}
	var doc map[string]map[string]any
	if err := json.Unmarshal([]byte(body), &doc); err != nil {
		l.t.Fatalf("decoding /configz: %v\n%s", err, body)
	}
	cfg, ok := doc["kubeproxy.config.k8s.io"]
	if !ok {
		l.t.Fatalf("/configz has no kubeproxy.config.k8s.io: %s", body)
	}
	return cfg
}

// field digs a dotted path out of a decoded JSON object.
func field(obj map[string]any, path string) any {
	var cur any = obj
	for _, k := range strings.Split(path, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[k]
	}
	return cur
}

// natRules returns the machine's nat table as iptables-save prints it. Its standard output is captured
// whole before it is printed, so that a warning on standard error comes out before the rules, not inside
// one of their lines.
func (l *lab) natRules() string {
	l.t.Helper()
	return l.must(`nat=$(iptables-save -t nat) && printf '%s\n' "$nat"`)
}

// noLegacyTables fails the test when the machine, whose rules are in nf_tables, has x_tables tables: reading
// a legacy table creates it, and from then on every iptables command there warns "iptables-legacy tables
// present".
func (l *lab) noLegacyTables(when string) {
	l.t.Helper()
	if out := l.must("cat /proc/net/ip_tables_names /proc/net/ip6_tables_names 2>/dev/null || true"); strings.TrimSpace(out) != "" {
		l.t.Errorf("%s: legacy iptables tables exist: %q", when, strings.Fields(out))
	}
}

// journal returns kube-proxy's journal (messages only) since the machine booted.
func (l *lab) journal() string {
	l.t.Helper()
	return l.must("journalctl -u kube-proxy --no-pager -o cat")
}

// verifyUnit runs `systemd-analyze verify` on unit (a path or a name) and fails on any output: it exits 0
// on unknown keys and bad values, and prints them.
func (l *lab) verifyUnit(unit string) {
	l.t.Helper()
	r := l.run("systemd-analyze verify " + unit)
	if r.Code != 0 || strings.TrimSpace(r.Out) != "" {
		l.t.Errorf("in %s: systemd-analyze verify %s: exit %d, output:\n%s", l.suite.Name, unit, r.Code, r.Out)
	}
}

// labService is a Service with one ready endpoint, written to the API server, so a sync has rules to write.
type labService struct {
	Namespace, Name string
	ClusterIP       string
}

// Comment is the text the rules carry for the Service's port ("ns/name:port").
func (s labService) Comment() string { return s.Namespace + "/" + s.Name + ":http" }

// createService creates, in a fresh namespace, a ClusterIP Service with one ready endpoint in the guide's
// clusterCIDR, and the Node "lab" (the machines' host name, InternalIP 10.0.0.10) that the daemon reads.
func createService(t *testing.T, c *harness.Cluster) labService {
	t.Helper()
	harness.EnsureNode(t, c, "lab", "10.0.0.10", "", nil)
	ns := c.Namespace(t, "lab")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	svc, err := c.Admin.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{
			Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ready := true
	_, err = c.Admin.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.200.1.5"},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080)), Protocol: ptr(corev1.ProtocolTCP)}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return labService{Namespace: ns, Name: svc.Name, ClusterIP: svc.Spec.ClusterIP}
}

func ptr[T any](v T) *T { return &v }

// guideBlocks returns the lab blocks of docs/INSTALL.md.
func guideBlocks(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "docs/INSTALL.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := DocBlocks(string(b))
	if err != nil {
		t.Fatalf("docs/INSTALL.md: %v", err)
	}
	return blocks
}

// measurement is one timing, logged together at the end of a test for the report.
type measurement struct {
	suite, what string
	took        time.Duration
}

func logMeasurements(t *testing.T, ms []measurement) {
	t.Helper()
	var b strings.Builder
	for _, m := range ms {
		fmt.Fprintf(&b, "\n  %-9s %-40s %8.0f ms", m.suite, m.what, float64(m.took)/float64(time.Millisecond))
	}
	t.Logf("timings:%s", b.String())
}
