package harness

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// EnvE2E is the environment variable that turns e2e tests on: unset (or "" or "0") skips them; any
// other value runs them, and then a missing prerequisite fails the test instead of skipping it.
const EnvE2E = "KP_E2E"

// Enabled reports whether KP_E2E asks for e2e tests.
func Enabled() bool {
	v := os.Getenv(EnvE2E)
	return v != "" && v != "0"
}

// baseTools are the commands every e2e test of this harness needs.
var baseTools = []string{"ip", "sysctl"}

// Require skips t when KP_E2E is unset; otherwise it fails t, naming what is missing, unless the test
// runs as root and the commands in tools (plus ip and sysctl) are in PATH.
func Require(t testing.TB, tools ...string) {
	t.Helper()
	if !Enabled() {
		t.Skipf("e2e test: set %s=1 to run (needs root)", EnvE2E)
	}
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root (run the test binary as root)")
	}
	for _, tool := range append(append([]string(nil), baseTools...), tools...) {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, fmt.Sprintf("command %q (install with .ci/deps.sh)", tool))
		}
	}
	if len(missing) > 0 {
		t.Fatalf("%s is set but prerequisites are missing: %s", EnvE2E, strings.Join(missing, "; "))
	}
}

// RequireCluster is Require plus the cluster binaries (BinDir).
func RequireCluster(t testing.TB, tools ...string) {
	t.Helper()
	Require(t, tools...)
	if _, err := BinDir(); err != nil {
		t.Fatalf("%s is set but %v", EnvE2E, err)
	}
}

// ForTest starts a cluster of its own for t in a directory under t.TempDir(), registers Stop with
// t.Cleanup, and on failure (to start, or of the test later) logs the apiserver and etcd log tails.
// A start costs a few seconds: packages with many tests should share one with Main + SharedCluster.
func ForTest(t testing.TB) *Cluster {
	t.Helper()
	return ForTestWith(t, ClusterOptions{})
}

// ForTestWith is ForTest with options (a dual-stack cluster, say).
func ForTestWith(t testing.TB, opts ClusterOptions) *Cluster {
	t.Helper()
	RequireCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	c, err := StartClusterWith(ctx, t.TempDir(), opts)
	if err != nil {
		t.Fatalf("starting cluster: %v", err)
	}
	t.Logf("cluster up in %v at %s (state in %s)", time.Since(start).Round(time.Millisecond), c.Server, c.Dir)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("cluster logs:\n%s", c.LogTail(40))
		}
		if err := c.Stop(); err != nil {
			t.Errorf("stopping cluster: %v", err)
		}
	})
	return c
}

var shared struct {
	mu      sync.Mutex
	main    bool
	started bool
	c       *Cluster
	err     error
	dir     string
}

// Main runs a package's tests and then tears down what they shared; call it from TestMain:
//
//	func TestMain(m *testing.M) { harness.Main(m) }
//
// Before the tests it removes network namespaces left by dead test binaries (RemoveStaleNetNS).
// After them it stops the SharedCluster, if one was started, and removes its directory (kept, with
// its path printed, when KP_E2E_KEEP is set). The test binary exits with m.Run's result.
func Main(m *testing.M) {
	shared.mu.Lock()
	shared.main = true
	shared.mu.Unlock()
	if Enabled() && os.Geteuid() == 0 {
		if removed, err := RemoveStaleNetNS(); err != nil || len(removed) > 0 {
			fmt.Fprintf(os.Stderr, "harness: removed stale namespaces %v (errors: %v)\n", removed, err)
		}
	}
	code := m.Run()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.c != nil {
		if err := shared.c.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "harness: stopping shared cluster: %v\n", err)
		}
		if code != 0 {
			fmt.Fprintf(os.Stderr, "harness: shared cluster logs:\n%s\n", shared.c.LogTail(40))
		}
	}
	if shared.dir != "" {
		if os.Getenv("KP_E2E_KEEP") != "" {
			fmt.Fprintf(os.Stderr, "harness: shared cluster state kept in %s\n", shared.dir)
		} else {
			_ = os.RemoveAll(shared.dir)
		}
	}
}

// SharedCluster returns the package's one cluster, starting it on first use; it is stopped by Main,
// which the package's TestMain must call. Tests sharing it should keep to namespaces of their own
// (see Namespace).
func SharedCluster(t testing.TB) *Cluster {
	t.Helper()
	RequireCluster(t)
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if !shared.main {
		t.Fatal("harness.SharedCluster needs the package's TestMain to call harness.Main(m)")
	}
	if !shared.started {
		shared.started = true
		shared.dir, shared.err = os.MkdirTemp("", "kpt-cluster-")
		if shared.err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			start := time.Now()
			shared.c, shared.err = StartCluster(ctx, shared.dir)
			cancel()
			if shared.err == nil {
				t.Logf("shared cluster up in %v at %s", time.Since(start).Round(time.Millisecond), shared.c.Server)
			}
		}
	}
	if shared.err != nil {
		t.Fatalf("starting shared cluster: %v", shared.err)
	}
	return shared.c
}

// Namespace creates a Kubernetes namespace with a unique name starting with prefix and deletes it
// when t ends.
func (c *Cluster) Namespace(t testing.TB, prefix string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ns, err := c.Admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating namespace: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// Without a controller-manager nothing finalizes it; deleting marks it Terminating, enough
		// to keep names from being reused.
		_ = c.Admin.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{})
	})
	return ns.Name
}

// NetNSForTest is NewNetNS with the namespace deleted when t ends; it fails t on error.
func NetNSForTest(t testing.TB, label string) *NetNS {
	t.Helper()
	n, err := NewNetNS(label)
	if err != nil {
		t.Fatalf("creating network namespace: %v", err)
	}
	t.Cleanup(func() {
		if err := n.Delete(); err != nil {
			t.Errorf("deleting network namespace: %v", err)
		}
	})
	return n
}

// TopologyForTest is NewTopologyWith with Close registered on t.Cleanup; it fails t on error.
func TopologyForTest(t testing.TB, opts TopologyOptions) *Topology {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	topo, err := NewTopologyWith(ctx, opts)
	if err != nil {
		t.Fatalf("creating topology: %v", err)
	}
	if opts.NodeBPods > 0 {
		t.Logf("two-node topology with %d+%d pods up in %v", opts.Pods, opts.NodeBPods, time.Since(start).Round(time.Millisecond))
	} else {
		t.Logf("topology with %d pods up in %v", opts.Pods, time.Since(start).Round(time.Millisecond))
	}
	t.Cleanup(func() {
		if err := topo.Close(); err != nil {
			t.Errorf("closing topology: %v", err)
		}
	})
	return topo
}

// BridgeForTest is Cluster.Bridge with stop registered on t.Cleanup; it returns the in-namespace
// kube-proxy kubeconfig.
func (c *Cluster) BridgeForTest(t testing.TB, ns *NetNS) string {
	t.Helper()
	kc, stop, err := c.Bridge(ns)
	if err != nil {
		t.Fatalf("bridging apiserver into %s: %v", ns.Name, err)
	}
	t.Cleanup(stop)
	return kc
}
