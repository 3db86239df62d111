package ipvsvm_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"kube-proxy/e2e/faults"
	"kube-proxy/e2e/harness"
	"kube-proxy/e2e/ipvsvm"
)

// EnvFaults narrows TestIPVSFaultsInVM to some rows (comma-separated names of ipvsvm.FaultNames).
const EnvFaults = "KP_VM_FAULTS"

// TestIPVSFaultsInVM measures the fault table's rows for mode ipvs (e2e/faults measures modes iptables
// and nftables on this host's kernel, which has no IP_VS) in one boot of the VM: the daemon runs there
// against this host's apiserver with traffic flowing to a Service, and the guest agent breaks one thing
// at a time (see guest/faults.go). The host stops and starts its apiserver and creates Services when the
// agent asks, over HTTP on loopback (qemu's user network makes it 10.0.2.2 in the guest), and records
// every ROW line the agent sends with e2e/faults' appender (KP_FAULTS_ROWS). Short durations by default
// (about two minutes with the boot); KP_FAULTS_LONG=1 for the full ones (about twenty minutes).
func TestIPVSFaultsInVM(t *testing.T) {
	k, agent := require(t)
	harness.RequireCluster(t)
	daemon, err := harness.DaemonBinary()
	if err != nil {
		t.Fatal(err)
	}
	c := harness.ForTest(t)
	harness.EnsureNode(t, c, ipvsvm.NodeName, ipvsvm.NodeIP, "10.244.0.0/16", nil)
	ns := c.Namespace(t, "ipvsfault")
	kubeconfig, err := guestKubeconfig(c)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	web, err := createFaultService(ctx, c, ns, "web", v1.ServiceTypeNodePort, podEndpoints(1, 2, 3))
	if err != nil {
		t.Fatal(err)
	}
	syncPeriod := faults.Pick(5*time.Second, 30*time.Second)
	fp := &ipvsvm.FaultsParams{
		Binary: ipvsvm.DaemonPath, Config: ipvsvm.ConfigPath,
		WebIP: web.Spec.ClusterIP, WebNodePort: int(web.Spec.Ports[0].NodePort),
		SyncPeriod: syncPeriod.String(),
		Baseline:   faults.Pick(6*time.Second, 120*time.Second).String(),
		APIDown:    faults.Pick(6*time.Second, 120*time.Second).String(),
		FailFor:    faults.Pick(20*time.Second, 10*time.Minute).String(),
		Big:        faults.Pick(1000, 10000),
	}
	if s := os.Getenv(EnvFaults); s != "" {
		fp.Faults = strings.Split(s, ",")
	}
	files := map[string][]byte{ipvsvm.KubeconfigPath: kubeconfig}
	if fb := os.Getenv(harness.EnvFaultsBinary); fb != "" {
		// A file rather than one of Options.Binaries: their ldd check takes a static binary's exit status 1
		// (its message goes to stderr) for a failure. The agent makes it executable.
		fp.FaultsBinary = "/kp/kube-proxy-faults"
		if files[fp.FaultsBinary], err = os.ReadFile(fb); err != nil {
			t.Fatal(err)
		}
	} else {
		t.Logf("%s is not set (make build-faults): the apply-failing row is skipped", harness.EnvFaultsBinary)
	}

	// The host's side of the agent's requests, on loopback.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: faultControl(t, c, ns)}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	t.Cleanup(func() { _ = c.StartAPIServer(context.Background()) }) // in case a run ended while it was down
	fp.Control = fmt.Sprintf("http://10.0.2.2:%d", ln.Addr().(*net.TCPAddr).Port)

	var mu sync.Mutex
	var hostErrs []string
	rows := 0
	onLine := func(line string) {
		js, ok := strings.CutPrefix(line, "ROW ")
		if !ok {
			return
		}
		var r faults.Row
		err := json.Unmarshal([]byte(js), &r)
		if err == nil {
			t.Logf("row: %s | %s | sent %d, failed %d | converge %s | %s", r.Fault, r.Mode, r.Sent, r.Failed, r.Converge, r.Sees)
			err = faults.Record(r)
		}
		mu.Lock()
		defer mu.Unlock()
		rows++
		if err != nil {
			hostErrs = append(hostErrs, fmt.Sprintf("recording a row: %v", err))
		}
	}
	files[ipvsvm.ConfigPath] = []byte(strings.Replace(guestConfig, "syncPeriod: 30s", "syncPeriod: "+syncPeriod.String(), 1))
	opts := ipvsvm.Options{
		Agent:    agent,
		Daemon:   daemon,
		Params:   ipvsvm.Params{Faults: fp},
		Files:    files,
		MemoryMB: 1536,
		Timeout:  faults.Pick(8*time.Minute, 45*time.Minute),
		OnLine:   onLine,
		Logf:     t.Logf,
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
	if cr, ok := res.Case("faults"); ok {
		t.Errorf("the fault rows: %s: %s\nconsole tail:\n%s", cr.Status, cr.Detail, tail(res, 60))
	}
	names := ipvsvm.FaultNames
	if len(fp.Faults) > 0 {
		names = fp.Faults
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			cr, ok := res.Case("fault-" + name)
			switch {
			case !ok:
				t.Fatalf("the guest did not report row %s\nconsole tail:\n%s", name, tail(res, 40))
			case cr.Status == "PASS":
				t.Logf("%s", cr.Detail)
			case cr.Status == "SKIP":
				t.Skip(cr.Detail)
			default:
				t.Fatalf("%s: %s", cr.Status, cr.Detail)
			}
		})
	}
	t.Logf("%d rows recorded", rows)
	if res.Done != 0 && !t.Failed() {
		t.Errorf("the guest agent finished with %d\nconsole tail:\n%s", res.Done, tail(res, 40))
	}
}

// faultControl answers the agent's requests (ipvsvm.FaultActions): each returns once done, the create
// actions with the new Service's cluster IP.
func faultControl(t *testing.T, c *harness.Cluster, ns string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Minute)
		defer cancel()
		action := strings.TrimPrefix(r.URL.Path, "/")
		q := r.URL.Query()
		start := time.Now()
		var answer string
		var err error
		switch action {
		case ipvsvm.ActionStopAPIServer:
			err = c.StopAPIServer()
		case ipvsvm.ActionStartAPIServer:
			err = c.StartAPIServer(ctx)
		case ipvsvm.ActionCreate:
			var pod int
			if pod, err = strconv.Atoi(q.Get("pod")); err == nil {
				var svc *v1.Service
				svc, err = createFaultService(ctx, c, ns, q.Get("name"), v1.ServiceTypeClusterIP, podEndpoints(pod))
				if err == nil {
					answer = svc.Spec.ClusterIP
				}
			}
		case ipvsvm.ActionCreateBig:
			var n int
			if n, err = strconv.Atoi(q.Get("n")); err == nil {
				eps := make([]string, n)
				for i := range eps {
					eps[i] = harness.BigServiceAddr(i) // 10.246.0.0/16: no pod has them
				}
				var svc *v1.Service
				svc, err = createFaultService(ctx, c, ns, q.Get("name"), v1.ServiceTypeClusterIP, eps)
				if err == nil {
					answer = svc.Spec.ClusterIP
				}
			}
		default:
			err = fmt.Errorf("unknown action %q", action)
		}
		t.Logf("host: %s %s: %v (%v)", action, q.Encode(), err, time.Since(start).Round(time.Millisecond))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		fmt.Fprintln(w, answer)
	})
}

func podEndpoints(pods ...int) []string {
	out := make([]string, 0, len(pods))
	for _, p := range pods {
		out = append(out, fmt.Sprintf("10.244.%d.2", p))
	}
	return out
}

// createFaultService creates a Service (TCP port 80 named http, to port 80) of the given type with the
// addresses as ready endpoints on the VM's node, in slices of at most 1,000.
func createFaultService(ctx context.Context, c *harness.Cluster, ns, name string, typ v1.ServiceType, addrs []string) (*v1.Service, error) {
	portName, port, proto, ready, node := "http", int32(80), v1.ProtocolTCP, true, ipvsvm.NodeName
	for s := 0; s*1000 < len(addrs); s++ {
		es := &discovery.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", name, s), Namespace: ns, Labels: map[string]string{discovery.LabelServiceName: name}},
			AddressType: discovery.AddressTypeIPv4,
			Ports:       []discovery.EndpointPort{{Name: &portName, Port: &port, Protocol: &proto}},
		}
		for _, a := range addrs[s*1000 : min(len(addrs), (s+1)*1000)] {
			es.Endpoints = append(es.Endpoints, discovery.Endpoint{Addresses: []string{a},
				Conditions: discovery.EndpointConditions{Ready: &ready}, NodeName: &node})
		}
		if _, err := c.Admin.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("creating slice %s: %w", es.Name, err)
		}
	}
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1.ServiceSpec{Type: typ,
			Ports: []v1.ServicePort{{Name: portName, Port: port, TargetPort: intstr.FromInt32(80), Protocol: proto}}},
	}
	return c.Admin.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
}
