package ipvsvm_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"kube-proxy/e2e/harness"
	"kube-proxy/e2e/ipvsvm"
)

// The side-by-side benchmark's knobs.
const (
	// EnvBench asks for the benchmark with that many Services (e.g. 1000).
	EnvBench = "KP_IPVS_BENCH"
	// EnvBenchRuns is how many runs per implementation (default 3), EnvBenchChanges how many one-Service
	// changes per run (default 10; 0 skips them, for an implementation whose changes take longer than a run
	// can wait, so that its idle period is still measured).
	EnvBenchRuns    = "KP_IPVS_BENCH_RUNS"
	EnvBenchChanges = "KP_IPVS_BENCH_CHANGES"
	// EnvBenchProfile, a duration ("200s"), has the agent profile ours' cold start for that long and its
	// idle period; the profiles are written beside the console log (such runs' figures are skewed).
	EnvBenchProfile = "KP_IPVS_BENCH_PROFILE"
	// EnvBenchImpls names the implementations and their order ("upstream,ours" by default; "ours" alone,
	// say).
	EnvBenchImpls = "KP_IPVS_BENCH_IMPLS"
)

// benchConfig is the configuration file both implementations run with: the defaults of mode ipvs
// (minSyncPeriod 0 s in both) but for a short syncPeriod, so that an idle period holds a resync.
const benchConfig = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: ` + ipvsvm.KubeconfigPath + `
hostnameOverride: ` + ipvsvm.NodeName + `
mode: ipvs
clusterCIDR: ` + ipvsvm.ClusterCIDR + `
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
ipvs:
  syncPeriod: 20s
conntrack:
  maxPerCore: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`

// benchIdle is longer than benchConfig's syncPeriod: every idle period holds one periodic full sync.
const benchIdle = "25s"

// TestIPVSSyncBenchmark runs upstream kube-proxy v1.37.2 and ours in IPVS mode, one after the other in
// the same boot, on the same KP_IPVS_BENCH Services × 3 endpoints held by this host's apiserver, each
// observed the same way by the guest agent (see the agent's sideBySide), then the IPVS writer's own
// benchmark. It prints a table of medians over the runs and ours/upstream ratios.
func TestIPVSSyncBenchmark(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv(EnvBench))
	if n <= 0 {
		t.Skipf("set %s=N (e.g. 1000) to run the IPVS benchmark", EnvBench)
	}
	runs, changes := envInt(EnvBenchRuns, 3), envInt(EnvBenchChanges, 10)
	if os.Getenv(EnvBenchChanges) == "0" {
		changes = 0
	}
	k, agent := require(t)
	harness.RequireCluster(t)
	ours, err := harness.DaemonBinary()
	if err != nil {
		t.Fatal(err)
	}
	bin, err := harness.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	upstream := filepath.Join(bin, "kube-proxy")
	impls := []ipvsvm.BenchImpl{
		{Name: "upstream", Args: []string{ipvsvm.UpstreamPath, "--config=" + ipvsvm.ConfigPath, "--v=2"}},
		{Name: "ours", Args: []string{ipvsvm.DaemonPath, "--config=" + ipvsvm.ConfigPath, "--v=2"}},
	}
	if only := os.Getenv(EnvBenchImpls); only != "" {
		// These, in this order (the first runs first in odd runs).
		var chosen []ipvsvm.BenchImpl
		for _, name := range strings.Split(only, ",") {
			if i := slices.IndexFunc(impls, func(i ipvsvm.BenchImpl) bool { return i.Name == name }); i >= 0 {
				chosen = append(chosen, impls[i])
			}
		}
		impls = chosen
	}

	c := harness.ForTest(t)
	harness.EnsureNode(t, c, ipvsvm.NodeName, ipvsvm.NodeIP, "10.244.0.0/16", nil)
	kubeconfig, err := guestKubeconfig(c)
	if err != nil {
		t.Fatal(err)
	}
	ns := c.Namespace(t, "ipvsbench")
	ctx := context.Background()
	start := time.Now()
	if err := createBenchServices(ctx, c, ns, n); err != nil {
		t.Fatal(err)
	}
	t.Logf("created %d Services and EndpointSlices in %v", n, time.Since(start).Round(time.Millisecond))

	var hostErrs []string
	var mu sync.Mutex
	onLine := func(line string) {
		var i, gen int
		if _, err := fmt.Sscanf(line, "WAIT bench-change %d %d", &i, &gen); err != nil {
			return
		}
		if err := updateBenchSlice(ctx, c, ns, i, gen); err != nil {
			mu.Lock()
			hostErrs = append(hostErrs, fmt.Sprintf("changing Service %d: %v", i, err))
			mu.Unlock()
		}
	}
	config, profile := benchConfig, os.Getenv(EnvBenchProfile)
	if profile != "" {
		config += "enableProfiling: true\n"
	}
	timeout := time.Duration(runs*len(impls))*(5*time.Minute+time.Duration(n)*400*time.Millisecond) + 10*time.Minute
	opts := ipvsvm.Options{
		Agent:    agent,
		Daemon:   ours,
		Binaries: map[string]string{ipvsvm.UpstreamPath: upstream},
		Files:    map[string][]byte{ipvsvm.KubeconfigPath: kubeconfig, ipvsvm.ConfigPath: []byte(config)},
		Params: ipvsvm.Params{Bench: n, SideBySide: &ipvsvm.SideBySideParams{Services: n, Runs: runs, Changes: changes,
			Idle: benchIdle, Impls: impls, Profile: profile}},
		MemoryMB: 3072,
		Timeout:  timeout,
		OnLine:   onLine,
		Logf:     t.Logf,
	}
	if os.Getenv(EnvConsole) != "" {
		opts.Console = testWriter{t}
	}
	res, err := ipvsvm.Run(ctx, k, opts)
	if err != nil {
		t.Fatalf("%v\nconsole tail:\n%s", err, tail(res, 60))
	}
	t.Logf("VM: boot and run %v, console log %s", res.Boot.Round(time.Second), res.ConsoleLog)
	for _, e := range hostErrs {
		t.Error(e)
	}
	t.Log(benchTable(res.Bench, n, runs, k.Version))
	for name, b := range res.Files {
		p := filepath.Join(filepath.Dir(res.ConsoleLog), name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Error(err)
		}
		t.Logf("%s: %d bytes (go tool pprof -top %s %s)", p, len(b), ours, p)
	}
	for _, name := range []string{"sidebyside", "bench"} {
		if cr, ok := res.Case(name); !ok || cr.Status != "PASS" {
			t.Errorf("%s: %+v\nconsole tail:\n%s", name, cr, tail(res, 40))
		}
	}
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// benchTable writes every figure, and for the side-by-side ones the median over the runs per
// implementation and ours/upstream.
func benchTable(rs []ipvsvm.BenchResult, n, runs int, kernel string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "IPVS benchmark, %d Services x 3 endpoints, %d runs, Debian %s under qemu TCG:\n", n, runs, kernel)
	per := map[string]map[string][]float64{} // figure -> impl -> values
	var figures []string
	for _, r := range rs {
		fmt.Fprintf(&b, "  %-28s %9.3f  %s\n", r.Name, r.Seconds, r.Detail)
		impl, fig, ok := strings.Cut(r.Name, "/")
		if !ok {
			continue
		}
		if per[fig] == nil {
			per[fig] = map[string][]float64{}
			figures = append(figures, fig)
		}
		per[fig][impl] = append(per[fig][impl], r.Seconds)
	}
	median := func(v []float64) float64 {
		if len(v) == 0 {
			return 0
		}
		v = slices.Clone(v)
		sort.Float64s(v)
		return v[len(v)/2]
	}
	fmt.Fprintf(&b, "\n  %-16s %12s %12s %8s\n", "median", "upstream", "ours", "ours/up")
	for _, f := range figures {
		u, o := median(per[f]["upstream"]), median(per[f]["ours"])
		ratio := "-"
		if u > 0 && o > 0 {
			ratio = strconv.FormatFloat(o/u, 'g', 2, 64)
		}
		fmt.Fprintf(&b, "  %-16s %12.3f %12.3f %8s\n", f, u, o, ratio)
	}
	return b.String()
}

func benchService(i int) string { return fmt.Sprintf("svc-%05d", i) }

// createBenchServices writes the N Services and their EndpointSlices with 16 writers.
func createBenchServices(ctx context.Context, c *harness.Cluster, ns string, n int) error {
	work := make(chan int)
	errs := make(chan error, 16)
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				svc := &v1.Service{
					ObjectMeta: metav1.ObjectMeta{Name: benchService(i), Namespace: ns},
					Spec: v1.ServiceSpec{ClusterIP: ipvsvm.BenchClusterIP(i).String(), Ports: []v1.ServicePort{{Name: "http",
						Port: ipvsvm.BenchPort, TargetPort: intstr.FromInt32(ipvsvm.BenchTargetPort), Protocol: v1.ProtocolTCP}}},
				}
				if _, err := c.Admin.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
					errs <- err
					return
				}
				if _, err := c.Admin.DiscoveryV1().EndpointSlices(ns).Create(ctx, benchSlice(ns, i, 0), metav1.CreateOptions{}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		select {
		case work <- i:
		case err := <-errs:
			close(work)
			wg.Wait()
			return err
		}
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

func benchSlice(ns string, i, gen int) *discovery.EndpointSlice {
	es := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: benchService(i) + "-1", Namespace: ns, Labels: map[string]string{discovery.LabelServiceName: benchService(i)}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(int32(ipvsvm.BenchTargetPort)), Protocol: ptr.To(v1.ProtocolTCP)}},
	}
	for _, a := range ipvsvm.BenchEndpoints(i, gen) {
		es.Endpoints = append(es.Endpoints, discovery.Endpoint{Addresses: []string{a.String()},
			Conditions: discovery.EndpointConditions{Ready: ptr.To(true)}})
	}
	return es
}

// updateBenchSlice gives Service i the endpoints of generation gen.
func updateBenchSlice(ctx context.Context, c *harness.Cluster, ns string, i, gen int) error {
	cur, err := c.Admin.DiscoveryV1().EndpointSlices(ns).Get(ctx, benchService(i)+"-1", metav1.GetOptions{})
	if err != nil {
		return err
	}
	es := benchSlice(ns, i, gen)
	es.ResourceVersion = cur.ResourceVersion
	_, err = c.Admin.DiscoveryV1().EndpointSlices(ns).Update(ctx, es, metav1.UpdateOptions{})
	return err
}
