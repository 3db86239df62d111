package systemdlab

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"kube-proxy/e2e/harness"
)

// The endpoint of the userspace Service: an address on a link inside the machine, where the pod server
// answers.
const (
	usEndpointIP = "10.200.1.5"
	usTCPPort    = 8080
	usUDPPort    = 5353
)

// createUserspaceService creates, in a fresh namespace, the ClusterIP Service "web" with a TCP port (80)
// and a UDP port (53) whose one ready endpoint is usEndpointIP, and the Node "lab".
func createUserspaceService(t *testing.T, c *harness.Cluster) (ns, clusterIP string) {
	t.Helper()
	harness.EnsureNode(t, c, "lab", "10.0.0.10", "", nil)
	ns = c.Namespace(t, "labus")
	return ns, addUserspaceService(t, c, ns, "web")
}

// addUserspaceService creates Service name in ns as createUserspaceService describes, and returns its
// cluster IP.
func addUserspaceService(t *testing.T, c *harness.Cluster, ns, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	svc, err := c.Admin.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{
			{Name: "tcp", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(usTCPPort)},
			{Name: "udp", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(usUDPPort)},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Admin.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{usEndpointIP},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}}},
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr("tcp"), Port: ptr(int32(usTCPPort)), Protocol: ptr(corev1.ProtocolTCP)},
			{Name: ptr("udp"), Port: ptr(int32(usUDPPort)), Protocol: ptr(corev1.ProtocolUDP)},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return svc.Spec.ClusterIP
}

// startEndpoint gives the machine a link (a veth pair, both ends inside) with usEndpointIP and a route for
// the service range, and runs the pod server there (in the machine's network namespace, from the host),
// until the test ends.
func (l *lab) startEndpoint() {
	l.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := l.m.NS.IPBatch(ctx, []string{
		"link add ep0 type veth peer name ep0p",
		"addr add " + usEndpointIP + "/32 dev ep0",
		"link set ep0 up",
		"link set ep0p up",
		"route add " + harness.ServiceCIDR + " dev ep0 src " + usEndpointIP,
	}); err != nil {
		l.t.Fatal(err)
	}
	bin, err := harness.BuildPodServer()
	if err != nil {
		l.t.Fatal(err)
	}
	dir := l.t.TempDir()
	ready := filepath.Join(dir, "ready")
	cmd := l.m.NS.Command(context.Background(), bin, "-name", "ep1", "-tcp", fmt.Sprint(usTCPPort), "-udp", fmt.Sprint(usUDPPort), "-ready", ready)
	p, err := harness.StartProcess("podserver ep1", cmd, filepath.Join(dir, "podserver.log"))
	if err != nil {
		l.t.Fatal(err)
	}
	l.t.Cleanup(func() { _ = p.Stop(os.Interrupt, 5*time.Second) })
	l.waitFor("the pod server", 10*time.Second, func() bool { _, err := os.Stat(ready); return err == nil })
}

// listenerPorts returns the listener ports the capture rules point Service ns/name's ports at, by
// protocol; none when the rules have none for it.
func (l *lab) listenerPorts(ns, name string) map[string]string {
	l.t.Helper()
	re := regexp.MustCompile(`-A KUBE-PORTALS-HOST .*-p (tcp|udp) .*--comment "?` + regexp.QuoteMeta(ns+"/"+name) + `:(tcp|udp)"? .*--to-ports (\d+)`)
	out := map[string]string{}
	for _, m := range re.FindAllStringSubmatch(l.natRules(), -1) {
		out[m[1]] = m[3]
	}
	return out
}

// allListenerPorts returns the listener port of every Service port the capture rules redirect from the
// machine, by the rule's comment and protocol: the shared cluster holds other tests' Services and the
// default "kubernetes" Service too, and the daemon opens a listener for each.
func (l *lab) allListenerPorts() map[string]string {
	l.t.Helper()
	re := regexp.MustCompile(`-A KUBE-PORTALS-HOST .*-p (tcp|udp) .*--comment "?([^" ]+)"? .*--to-ports (\d+)`)
	out := map[string]string{}
	for _, m := range re.FindAllStringSubmatch(l.natRules(), -1) {
		out[m[2]+"/"+m[1]] = m[3]
	}
	return out
}

// servicePorts is listenerPorts for a Service that must have both.
func (l *lab) servicePorts(ns, name string) map[string]string {
	l.t.Helper()
	out := l.listenerPorts(ns, name)
	if len(out) != 2 {
		l.t.Fatalf("no REDIRECT for both ports of %s/%s in KUBE-PORTALS-HOST:\n%s", ns, name, l.natRules())
	}
	return out
}

// refused reports whether a TCP connection to the machine's 127.0.0.1:port is refused.
func (l *lab) refused(port string) bool {
	l.t.Helper()
	res, err := harness.HitWith(context.Background(), l.m.NS, "tcp", "127.0.0.1:"+port, 1, harness.HitOptions{Timeout: time.Second})
	if err != nil {
		l.t.Fatal(err)
	}
	return res[0].Err == "refused"
}

// restartUnderTraffic keeps TCP connections and UDP exchanges going to the Service from the machine
// while `systemctl restart kube-proxy` runs n times, and returns every connection's result and how long
// each restart took.
func (l *lab) restartUnderTraffic(clusterIP string, n int) ([]harness.HitResult, []time.Duration) {
	l.t.Helper()
	tr := harness.StartTraffic(l.m.NS, []harness.Target{
		{Network: "tcp", Addr: harness.HostPort(clusterIP, 80)},
		{Network: "udp", Addr: harness.HostPort(clusterIP, 53)},
	})
	defer tr.Stop()
	tr.WaitFor(l.t, 100)
	var took []time.Duration
	for range n {
		r := l.run(resetStartLimit + "systemctl restart kube-proxy")
		if r.Code != 0 {
			l.t.Fatalf("systemctl restart: exit %d:\n%s", r.Code, r.Out)
		}
		took = append(took, r.Took)
		tr.WaitMore(l.t, 100)
	}
	return tr.Stop(), took
}

// resetStartLimit forgets the unit's recent starts: the test starts it more often than systemd's default
// start limit (5 in 10 s) allows.
const resetStartLimit = "systemctl reset-failed kube-proxy && "

// failures counts the failed connections by class ("refused", "timeout", ...) and network.
func failures(res []harness.HitResult) map[string]int {
	out := map[string]int{}
	for _, r := range res {
		if r.Err != "" {
			out[r.Err]++
		}
	}
	return out
}

// TestUserspaceRestart runs mode userspace under the unit with TCP and UDP traffic flowing to a Service
// from the machine itself, and restarts it: the listeners' sockets pass to the next process through
// systemd's file descriptor store, so the ports the rules point at never close, and no connection fails.
// A daemon-reload in between keeps the store. After a crash (Restart=on-failure) the store is kept too, and
// the listeners of a Service deleted meanwhile are released. A stop empties the store. Then, for
// comparison: with the store turned off (FileDescriptorStoreMax=0) connections fail across restarts, as
// before; with a store too small for both listeners (FileDescriptorStoreMax=1) one keeps its port and the
// other does not.
func TestUserspaceRestart(t *testing.T) {
	c := requireLab(t)
	blocks := guideBlocks(t)
	var ms []measurement
	for _, suite := range Suites {
		t.Run(suite.Name, func(t *testing.T) {
			ensureRootfs(t, suite)
			ns, clusterIP := createUserspaceService(t, c)
			addUserspaceService(t, c, ns, "extra")
			l := newLab(t, c, suite)
			l.startEndpoint()
			l.must(blocks["install"])
			l.must(blocks["config"])
			base := strings.Replace(l.must("cat "+configPath), "mode: iptables", "mode: userspace", 1)
			l.writeConfig(base)
			l.must("systemctl daemon-reload && systemctl enable --now kube-proxy")
			l.wantProps("after start", map[string]string{"ActiveState": "active", "SubState": "running", "FileDescriptorStoreMax": "16384"})
			before := l.servicePorts(ns, "web")
			extra := l.servicePorts(ns, "extra")
			if suite.Systemd >= 254 {
				// systemd-analyze fdstore exists from systemd 254.
				out := l.must("systemd-analyze fdstore kube-proxy.service")
				for _, want := range []string{"IPv4/TCP/cluster/" + ns + "/web%3Atcp", "IPv4/UDP/cluster/" + ns + "/web%3Audp"} {
					if !strings.Contains(out, want) {
						t.Errorf("the store lacks %s:\n%s", want, out)
					}
				}
			}

			// Restarts with traffic flowing, and one after a daemon-reload.
			res, took := l.restartUnderTraffic(clusterIP, 3)
			l.must("systemctl daemon-reload")
			more, took2 := l.restartUnderTraffic(clusterIP, 1)
			res = append(res, more...)
			for _, d := range append(took, took2...) {
				ms = append(ms, measurement{suite.Name, "systemctl restart (userspace, store)", d})
			}
			t.Logf("%s: 4 restarts with the store: %d connections, failures %v", suite.Name, len(res), failures(res))
			harness.ExpectNoFailures(t, suite.Name+": across 4 restarts", res)
			if after := l.servicePorts(ns, "web"); !maps.Equal(after, before) {
				t.Errorf("listener ports moved across the restarts: %v, then %v", before, after)
			}
			if j := l.journal(); !strings.Contains(j, "Took up the userspace proxy listener") {
				t.Error("the journal does not show a listener taken up from the store")
			}

			// A crash: Restart=on-failure starts a new process after RestartSec (5 s), the store kept
			// meanwhile. A Service deleted in that time leaves a stored listener no one takes: the new
			// process releases it once synced, and its port closes.
			pid := l.prop("MainPID")
			l.must(resetStartLimit + "systemctl kill -s KILL kube-proxy")
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := c.Admin.CoreV1().Services(ns).Delete(ctx, "extra", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			l.waitFor("the new process after the crash", 30*time.Second, func() bool {
				p := l.props("ActiveState", "SubState", "MainPID")
				return p["ActiveState"] == "active" && p["SubState"] == "running" && p["MainPID"] != pid && p["MainPID"] != "0"
			})
			if after := l.servicePorts(ns, "web"); !maps.Equal(after, before) {
				t.Errorf("listener ports moved across the crash: %v, then %v", before, after)
			}
			l.waitFor("the deleted Service's stored listener to be released", 30*time.Second, func() bool {
				return len(l.listenerPorts(ns, "extra")) == 0 && l.refused(extra["tcp"])
			})
			if j := l.journal(); !strings.Contains(j, "Released stored descriptors no one took") {
				t.Error("the journal does not show the deleted Service's listener released")
			}
			if suite.Systemd >= 254 {
				if out := l.must("systemd-analyze fdstore kube-proxy.service"); strings.Contains(out, "/extra%3A") {
					t.Errorf("the deleted Service's listeners are still stored:\n%s", out)
				}
			}

			// A stop empties the store: the ports close.
			l.must("systemctl stop kube-proxy")
			if !l.refused(before["tcp"]) {
				t.Errorf("after a stop, the TCP listener's port %s does not refuse", before["tcp"])
			}

			// The store turned off: what a restart did before.
			l.must("mkdir -p /etc/systemd/system/kube-proxy.service.d && printf '[Service]\\nFileDescriptorStoreMax=0\\n' >/etc/systemd/system/kube-proxy.service.d/fdstore.conf")
			l.must("systemctl daemon-reload && " + resetStartLimit + "systemctl start kube-proxy")
			off, _ := l.restartUnderTraffic(clusterIP, 3)
			lost := failures(off)
			t.Logf("%s: 3 restarts without the store: %d connections, failures %v", suite.Name, len(off), lost)
			if len(lost) == 0 {
				t.Errorf("without the store no connection failed across 3 restarts: the comparison shows nothing")
			}
			// The daemon cannot tell a store turned off from systemd 252's silence about its size, and sends;
			// systemd says no, once per listener.
			warned := strings.Count(l.must("journalctl --no-pager -o cat _PID=1"), "Cannot store more fds than FileDescriptorStoreMax=0")
			t.Logf("%s: with FileDescriptorStoreMax=0, systemd logged %d refusals to store for 4 starts of %d listeners",
				suite.Name, warned, len(l.allListenerPorts()))

			// A store too small for every listener (web's two, the "kubernetes" Service's, and those of the
			// other tests' Services in the shared cluster): the one stored first keeps its port, the others
			// are refused and get new ports, as without the store.
			l.must("systemctl stop kube-proxy && printf '[Service]\\nFileDescriptorStoreMax=1\\n' >/etc/systemd/system/kube-proxy.service.d/fdstore.conf")
			l.must("systemctl daemon-reload && " + resetStartLimit + "systemctl start kube-proxy")
			l.servicePorts(ns, "web")
			small := l.allListenerPorts()
			l.must(resetStartLimit + "systemctl restart kube-proxy")
			l.servicePorts(ns, "web")
			after := l.allListenerPorts()
			var kept []string
			for port, p := range small {
				if after[port] == p {
					kept = append(kept, port)
				}
			}
			t.Logf("%s: FileDescriptorStoreMax=1 with %d listeners: %d kept their port across a restart: %v", suite.Name, len(small), len(kept), kept)
			if len(small) < 2 || len(kept) != 1 {
				t.Errorf("with FileDescriptorStoreMax=1, %d of %d listeners kept their port across a restart, want 1:\n%v\nthen\n%v", len(kept), len(small), small, after)
			}
			sys := l.must("journalctl --no-pager -o cat _PID=1")
			own := l.journal()
			switch {
			case strings.Contains(own, "The file descriptor store is full"):
				t.Logf("%s: the daemon knew the store's size ($FDSTORE) and stored no more", suite.Name)
			case strings.Contains(sys, "Cannot store more fds than FileDescriptorStoreMax=1"):
				t.Logf("%s: systemd closed the descriptor over the limit", suite.Name)
			default:
				t.Errorf("neither the daemon nor systemd said the store was full")
			}
		})
	}
	logMeasurements(t, ms)
}
