package ipvsvm_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"kube-proxy/e2e/harness"
	"kube-proxy/e2e/ipvsvm"
)

func TestMain(m *testing.M) { harness.Main(m) }

// EnvConsole, when set, copies the VM's console to the test log as it runs.
const EnvConsole = "KP_VM_CONSOLE"

// EnvCases narrows TestIPVSInVM to some cases (comma-separated names; "daemon" for the daemon part).
const EnvCases = "KP_VM_CASES"

// require checks the prerequisites (installing missing packages with .ci/deps.sh when root) and returns
// the kernel and the agent.
func require(t *testing.T) (*ipvsvm.Kernel, string) {
	t.Helper()
	harness.Require(t)
	if missing := ipvsvm.MissingTools(); len(missing) > 0 {
		root, err := moduleRoot()
		if err == nil {
			out, err := exec.Command(filepath.Join(root, ".ci", "deps.sh")).CombinedOutput()
			t.Logf(".ci/deps.sh: %v %s", err, out)
		}
		if missing := ipvsvm.MissingTools(); len(missing) > 0 {
			t.Fatalf("%s is set but tools are missing: %s", harness.EnvE2E, strings.Join(missing, ", "))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	k, err := ipvsvm.EnsureKernel(ctx, t.Logf)
	if err != nil {
		t.Fatalf("preparing the VM kernel: %v", err)
	}
	agent, err := buildAgent()
	if err != nil {
		t.Fatal(err)
	}
	return k, agent
}

var agentBuild struct {
	once sync.Once
	path string
	err  error
}

// buildAgent builds the static guest agent once per test binary.
func buildAgent() (string, error) {
	agentBuild.once.Do(func() {
		root, err := moduleRoot()
		if err != nil {
			agentBuild.err = err
			return
		}
		out := filepath.Join(ipvsvm.CacheDir(), "agent")
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			agentBuild.err = err
			return
		}
		cmd := exec.Command("go", "build", "-buildvcs=false", "-trimpath", "-ldflags", "-s -w", "-o", out, "./e2e/ipvsvm/guest")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			agentBuild.err = fmt.Errorf("building the guest agent: %w: %s", err, b)
			return
		}
		agentBuild.path = out
	})
	return agentBuild.path, agentBuild.err
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.HasPrefix(string(b), "module kube-proxy\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no kube-proxy go.mod above the working directory")
		}
		dir = parent
	}
}

// guestKubeconfig is a kubeconfig for the guest: the apiserver through qemu's user networking
// (10.0.2.2 is the host's loopback), certificates inline, the server name the certificate carries.
func guestKubeconfig(c *harness.Cluster) ([]byte, error) {
	port := c.Server[strings.LastIndex(c.Server, ":")+1:]
	ca, err := os.ReadFile(c.CAFile)
	if err != nil {
		return nil, err
	}
	certFile, keyFile, err := c.ClientCert(harness.UserKubeProxy)
	if err != nil {
		return nil, err
	}
	cert, err := os.ReadFile(certFile)
	if err != nil {
		return nil, err
	}
	key, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, err
	}
	b64 := base64.StdEncoding.EncodeToString
	return []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: host
  cluster:
    server: https://10.0.2.2:%s
    tls-server-name: localhost
    certificate-authority-data: %s
users:
- name: kube-proxy
  user:
    client-certificate-data: %s
    client-key-data: %s
contexts:
- name: host
  context: {cluster: host, user: kube-proxy}
current-context: host
`, port, b64(ca), b64(cert), b64(key))), nil
}

const guestConfig = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: ` + ipvsvm.KubeconfigPath + `
hostnameOverride: ` + ipvsvm.NodeName + `
mode: ipvs
clusterCIDR: ` + ipvsvm.ClusterCIDR + `
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
ipvs:
  minSyncPeriod: 0s
  syncPeriod: 30s
conntrack:
  maxPerCore: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`

// serviceIP is the cluster IP of the Service the daemon part creates (in the harness's service CIDR).
const serviceIP = "10.96.200.10"

// TestIPVSInVM boots the VM once: every dataplane case, then the daemon against this host's apiserver.
func TestIPVSInVM(t *testing.T) {
	k, agent := require(t)
	cases, withDaemon := ipvsvm.CaseNames, true
	if s := os.Getenv(EnvCases); s != "" {
		cases, withDaemon = nil, false
		for _, c := range strings.Split(s, ",") {
			if c == "daemon" {
				withDaemon = true
			} else if c != "" {
				cases = append(cases, c)
			}
		}
	}
	ctx := context.Background()
	var c *harness.Cluster
	var ns, daemon string
	files := map[string][]byte{}
	var daemonParams *ipvsvm.DaemonParams
	if withDaemon {
		harness.RequireCluster(t)
		var err error
		if daemon, err = harness.DaemonBinary(); err != nil {
			t.Fatal(err)
		}
		c = harness.ForTest(t)
		harness.EnsureNode(t, c, ipvsvm.NodeName, ipvsvm.NodeIP, "10.244.0.0/16", nil)
		kubeconfig, err := guestKubeconfig(c)
		if err != nil {
			t.Fatal(err)
		}
		ns = c.Namespace(t, "ipvsvm")
		files[ipvsvm.KubeconfigPath], files[ipvsvm.ConfigPath] = kubeconfig, []byte(guestConfig)
		daemonParams = &ipvsvm.DaemonParams{Binary: ipvsvm.DaemonPath, Config: ipvsvm.ConfigPath, ServiceIP: serviceIP}
	}

	var hostErrs []string
	var mu sync.Mutex
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		hostErrs = append(hostErrs, fmt.Sprintf(format, args...))
	}
	onLine := func(line string) {
		switch line {
		case "WAIT create-service":
			if err := createService(ctx, c, ns); err != nil {
				fail("creating the Service: %v", err)
			}
		case "WAIT delete-service":
			if err := c.Admin.CoreV1().Services(ns).Delete(ctx, "vmweb", metav1.DeleteOptions{}); err != nil {
				fail("deleting the Service: %v", err)
			}
			if err := c.Admin.DiscoveryV1().EndpointSlices(ns).Delete(ctx, "vmweb-1", metav1.DeleteOptions{}); err != nil {
				fail("deleting the EndpointSlice: %v", err)
			}
		}
	}
	opts := ipvsvm.Options{
		Agent:   agent,
		Daemon:  daemon,
		Params:  ipvsvm.Params{Cases: cases, Daemon: daemonParams},
		Files:   files,
		Timeout: 6 * time.Minute,
		OnLine:  onLine,
		Logf:    t.Logf,
	}
	if os.Getenv(EnvConsole) != "" {
		opts.Console = testWriter{t}
	}
	res, err := ipvsvm.Run(ctx, k, opts)
	if res != nil {
		t.Logf("VM: initramfs %v, boot and run %v, console log %s", res.Prepare.Round(time.Millisecond),
			res.Boot.Round(time.Millisecond), res.ConsoleLog)
		for _, n := range res.Notes {
			t.Logf("guest: %s", n)
		}
	}
	if err != nil {
		t.Fatalf("%v\nconsole tail:\n%s", err, tail(res, 60))
	}
	for _, e := range hostErrs {
		t.Error(e)
	}
	names := append([]string{}, cases...)
	if withDaemon {
		names = append(names, "daemon")
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			cr, ok := res.Case(name)
			switch {
			case !ok:
				t.Fatalf("the guest did not report case %s\nconsole tail:\n%s", name, tail(res, 40))
			case cr.Status == "PASS":
				t.Logf("%s", cr.Detail)
			case cr.Status == "SKIP":
				t.Skip(cr.Detail)
			default:
				t.Fatalf("%s: %s", cr.Status, cr.Detail)
			}
		})
	}
	if res.Done != 0 && !t.Failed() {
		t.Errorf("the guest agent finished with %d\nconsole tail:\n%s", res.Done, tail(res, 40))
	}
}

// createService writes the daemon part's Service and its EndpointSlice (pod1 and pod2 of the VM).
func createService(ctx context.Context, c *harness.Cluster, ns string) error {
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "vmweb", Namespace: ns},
		Spec: v1.ServiceSpec{
			ClusterIP: serviceIP,
			Ports:     []v1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(80), Protocol: v1.ProtocolTCP}},
		},
	}
	if _, err := c.Admin.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return err
	}
	ready, name, port, proto := true, "http", int32(80), v1.ProtocolTCP
	node := ipvsvm.NodeName
	es := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "vmweb-1", Namespace: ns, Labels: map[string]string{discovery.LabelServiceName: "vmweb"}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: &name, Port: &port, Protocol: &proto}},
		Endpoints: []discovery.Endpoint{
			{Addresses: []string{"10.244.1.2"}, Conditions: discovery.EndpointConditions{Ready: &ready}, NodeName: &node},
			{Addresses: []string{"10.244.2.2"}, Conditions: discovery.EndpointConditions{Ready: &ready}, NodeName: &node},
		},
	}
	_, err := c.Admin.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{})
	return err
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// tail returns the last n lines of the console log.
func tail(res *ipvsvm.Result, n int) string {
	if res == nil {
		return ""
	}
	b, err := os.ReadFile(res.ConsoleLog)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
