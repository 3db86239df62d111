package userspace

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"kube-proxy/e2e/harness"
)

// udpMoveBound is how soon after the EndpointSlice's last write a client that keeps sending from one
// socket must be answered by the new endpoint. Measured on a busy 2-core host: 60–70 ms when the change
// came more than a second after the previous sync, 0.9–1.1 s when it came sooner (a sync waits
// minSyncPeriod, 1 s, after the previous one; the bed's 0s means the default), so within about one
// minSyncPeriod; the bound leaves room for a slow host.
const udpMoveBound = 3 * time.Second

// udpPinger sends a query every interval from one socket (one source address and port, as a resolver's)
// without waiting for answers, so that a flow pinned to a dead endpoint stays pinned: it never idles out.
type udpPinger struct {
	conn    net.Conn
	mu      sync.Mutex
	answers []udpAnswer
	stop    chan struct{}
	done    sync.WaitGroup
}

type udpAnswer struct {
	at  time.Time
	pod string
}

func startUDPPinger(t *testing.T, from *harness.NetNS, addr string, interval time.Duration) *udpPinger {
	t.Helper()
	p := &udpPinger{stop: make(chan struct{})}
	if err := from.Do(func() error {
		var err error
		p.conn, err = net.Dial("udp", addr)
		return err
	}); err != nil {
		t.Fatalf("UDP socket to %s: %v", addr, err)
	}
	p.done.Add(2)
	go func() {
		defer p.done.Done()
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			_, _ = p.conn.Write([]byte("query\n"))
			select {
			case <-p.stop:
				return
			case <-tick.C:
			}
		}
	}()
	go func() {
		defer p.done.Done()
		buf := make([]byte, 512)
		for {
			n, err := p.conn.Read(buf)
			if err != nil {
				select {
				case <-p.stop:
					return
				default:
					continue // an ICMP error for an earlier query: the socket stays usable
				}
			}
			name, _, _ := strings.Cut(string(buf[:n]), " ")
			p.mu.Lock()
			p.answers = append(p.answers, udpAnswer{at: time.Now(), pod: name})
			p.mu.Unlock()
		}
	}()
	t.Cleanup(p.close)
	return p
}

func (p *udpPinger) close() {
	select {
	case <-p.stop:
		return
	default:
	}
	close(p.stop)
	_ = p.conn.Close()
	p.done.Wait()
}

// firstFrom returns when pod first answered at or after since.
func (p *udpPinger) firstFrom(pod string, since time.Time) (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, a := range p.answers {
		if a.pod == pod && !a.at.Before(since) {
			return a.at, true
		}
	}
	return time.Time{}, false
}

// TestUDPEndpointReplaced: a UDP Service on port 53 whose only endpoint is replaced, with a client that
// sends a query every 100 ms from one socket whatever the answers (faster than the 250 ms UDP idle timeout,
// so its flow never idles out): once the change is synced the client's next queries reach the new
// endpoint, whether the old one is gone (its address removed: nothing answers there) or still answering,
// and however the replacement reaches the API: in one write, through a moment without endpoints, or as a
// rollout does it (the old endpoint terminating while the new one is not ready yet).
func TestUDPEndpointReplaced(t *testing.T) {
	type step struct {
		eps   []harness.Endpoint
		pause time.Duration // after writing eps
	}
	shapes := []struct {
		name  string
		steps []step
	}{
		{"in-one-write", []step{{eps: []harness.Endpoint{harness.ReadyEndpoint(2)}}}},
		{"through-no-endpoints", []step{
			{eps: nil, pause: 2 * time.Second},
			{eps: []harness.Endpoint{harness.ReadyEndpoint(2)}},
		}},
		{"rollout", []step{
			{eps: []harness.Endpoint{{Pod: 1, Serving: true, Terminating: true}, {Pod: 2}}, pause: time.Second},
			{eps: []harness.Endpoint{{Pod: 2}}, pause: time.Second},
			{eps: []harness.Endpoint{harness.ReadyEndpoint(2)}},
		}},
	}
	for _, oldAlive := range []bool{false, true} {
		for _, shape := range shapes {
			name := shape.name + "/old-endpoint-gone"
			if oldAlive {
				name = shape.name + "/old-endpoint-answering"
			}
			t.Run(name, func(t *testing.T) {
				b := newBed(t, 2)
				dns := b.CreateService(t, "dns", func(s *corev1.Service) {
					s.Spec.Ports = []corev1.ServicePort{{Name: "udp", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(harness.PodUDPPort)}}
				})
				b.SetEndpoints(t, "dns", harness.ReadyEndpoint(1))
				b.start("")
				start := time.Now()
				p := startUDPPinger(t, b.Topo.Client, harness.HostPort(dns.Spec.ClusterIP, 53), 100*time.Millisecond)
				harness.Eventually(t, "pod1 to answer", 10*time.Second, func() (bool, string) {
					_, ok := p.firstFrom("pod1", start)
					return ok, "no answer from pod1 yet"
				})
				if !oldAlive {
					ctx, cancel := b.Ctx()
					defer cancel()
					if _, err := b.Topo.Pods[0].NS.IP(ctx, "addr", "flush", "dev", "eth0"); err != nil {
						t.Fatal(err)
					}
				}
				var last time.Time
				for _, s := range shape.steps {
					b.SetEndpoints(t, "dns", s.eps...)
					last = time.Now()
					time.Sleep(s.pause)
				}
				var at time.Time
				harness.Eventually(t, "pod2 to answer the client's socket", 10*time.Second, func() (bool, string) {
					var ok bool
					at, ok = p.firstFrom("pod2", last)
					return ok, "no answer from pod2 since the last EndpointSlice write"
				})
				took := at.Sub(last)
				t.Logf("%s: pod2 answered the client's socket %v after the last EndpointSlice write", name, took.Round(time.Millisecond))
				if took > udpMoveBound {
					t.Errorf("the new endpoint answered %v after the change, want within %v", took.Round(time.Millisecond), udpMoveBound)
				}
				if oldAlive {
					// Nothing goes back to the old endpoint once the new one has answered.
					time.Sleep(time.Second)
					if back, ok := p.firstFrom("pod1", at); ok {
						t.Errorf("pod1 answered again at %v, after pod2 had", back.Sub(at).Round(time.Millisecond))
					}
				}
			})
		}
	}
}

// TestUDPFlowBeforeService: a client that starts sending from one socket before the Service can take its
// datagrams (the Service does not exist yet, or has no endpoints yet) and keeps sending every 100 ms is
// answered within a sync of the Service's listener opening. Its first datagrams made the kernel track the
// flow without a redirect; unless that entry is deleted, every later datagram follows it and never reaches
// the listener, for as long as the client keeps sending. Before the fix the first shape was never answered;
// the second was (a datagram the capture rules reject leaves no tracked flow) and guards that path.
func TestUDPFlowBeforeService(t *testing.T) {
	for i, tc := range []struct {
		name   string
		before bool // the Service exists, without endpoints, before the client sends
	}{
		{"service-created-later", false},
		{"endpoints-added-later", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBed(t, 1)
			clusterIP := fmt.Sprintf("10.96.250.%d", 53+i) // fixed, so the client can send before it exists
			create := func() {
				b.CreateService(t, "late-dns", func(s *corev1.Service) {
					s.Spec.ClusterIP = clusterIP
					s.Spec.Ports = []corev1.ServicePort{{Name: "udp", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(harness.PodUDPPort)}}
				})
			}
			if tc.before {
				create()
			}
			b.start("")
			p := startUDPPinger(t, b.Topo.Client, harness.HostPort(clusterIP, 53), 100*time.Millisecond)
			time.Sleep(time.Second) // the flow is tracked, unanswered
			if !tc.before {
				create()
			}
			b.SetEndpoints(t, "late-dns", harness.ReadyEndpoint(1))
			written := time.Now()
			var at time.Time
			harness.Eventually(t, "pod1 to answer the client's socket", 10*time.Second, func() (bool, string) {
				var ok bool
				at, ok = p.firstFrom("pod1", written)
				return ok, "no answer since the endpoints were written"
			})
			took := at.Sub(written)
			t.Logf("pod1 answered the client's socket %v after the EndpointSlice write", took.Round(time.Millisecond))
			if took > udpMoveBound {
				t.Errorf("answered %v after the endpoints were written, want within %v", took.Round(time.Millisecond), udpMoveBound)
			}
		})
	}
}
