package userspace

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"kube-proxy/e2e/harness"
)

// baseConfig: mode userspace, pods in PodCIDR, syncs at once.
const baseConfig = "mode: userspace\nclusterCIDR: " + harness.PodCIDR + "\niptables:\n  syncPeriod: 30s\n  minSyncPeriod: 0s\n"

const (
	svcTCP = harness.ServiceTCPPort
	svcUDP = harness.ServiceUDPPort
	// Addresses outside every range of the bed, routed to the node.
	externalIP = "192.0.2.10"
	lbIP       = "192.0.2.20"
	lbDenyIP   = "192.0.2.21"
)

// Our chains, as the tests expect them by name.
var (
	natChains    = []string{"KUBE-NODEPORT-CONTAINER", "KUBE-NODEPORT-HOST", "KUBE-PORTALS-CONTAINER", "KUBE-PORTALS-HOST"}
	filterChains = []string{"KUBE-PORTALS-FILTER"}
)

type bed struct {
	*harness.Bed
	t  *testing.T
	xt *harness.XTables
	d  *harness.Daemon
}

// newBed builds a bed with pods pod namespaces, steers the daemon to the nft backend, and routes the
// test's external and load-balancer addresses from the node and the client towards the node.
func newBed(t *testing.T, pods int) *bed {
	t.Helper()
	return newBedWith(t, harness.BedOptions{Pods: pods})
}

// newBedWith is newBed with more options (opts.Prefix and opts.Tools are set here).
func newBedWith(t *testing.T, opts harness.BedOptions) *bed {
	t.Helper()
	opts.Prefix = "usp"
	opts.Tools = []string{"iptables-nft", "iptables-nft-save", "iptables-legacy", "iptables-legacy-save"}
	b := &bed{t: t, Bed: harness.NewBed(t, opts)}
	ctx, cancel := b.Ctx()
	defer cancel()
	xt, err := harness.NewXTables(b.Topo.Node, harness.BackendNFT, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b.xt = xt
	if err := xt.SetHint(ctx); err != nil {
		t.Fatal(err)
	}
	// The node's own connections to external and LB IPs need a route before the OUTPUT rules see them.
	if _, err := b.Topo.Node.IP(ctx, "route", "add", "192.0.2.0/24", "dev", "eth0"); err != nil {
		t.Fatal(err)
	}
	return b
}

func (b *bed) start(extra string) *harness.Daemon {
	b.t.Helper()
	started := time.Now()
	b.d = harness.StartDaemon(b.t, b.Cluster, b.Topo.Node, harness.DaemonOptions{
		NodeName:   b.Node,
		Config:     baseConfig + extra,
		Env:        []string{b.xt.Env()},
		Kubeconfig: b.Kubeconfig,
	})
	b.t.Logf("kube-proxy (userspace) ready %v after start", time.Since(started).Round(time.Millisecond))
	return b.d
}

// save returns iptables-save of one IPv4 table in the nft backend.
func (b *bed) save(t testing.TB, table string) *harness.SavedTable {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := b.xt.Save(ctx, false, table)
	if err != nil {
		t.Fatalf("iptables-save: %v", err)
	}
	tab := harness.ParseSave(out)[table]
	if tab == nil {
		return &harness.SavedTable{Chains: map[string]string{}}
	}
	return tab
}

func (b *bed) setLoadBalancerIP(t testing.TB, name, ip string) {
	t.Helper()
	ctx, cancel := b.Ctx()
	defer cancel()
	api := b.Cluster.Admin.CoreV1().Services(b.NS)
	svc, err := api.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: ip}}
	if _, err := api.UpdateStatus(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("setting the load balancer IP of %s: %v", name, err)
	}
}

// createPortService creates a ClusterIP Service "name" with one TCP port, port -> targetPort.
func (b *bed) createPortService(t testing.TB, name string, port, targetPort int32) *corev1.Service {
	return b.CreateService(t, name, func(s *corev1.Service) {
		s.Spec.Ports = []corev1.ServicePort{{Name: "tcp", Port: port, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(targetPort)}}
	})
}

// setPortEndpoints writes the EndpointSlice of a createPortService Service: pods, ready, on this node,
// at port.
func (b *bed) setPortEndpoints(t testing.TB, svc string, port int32, pods ...int) {
	t.Helper()
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: svc + "-slice", Namespace: b.NS,
			Labels: map[string]string{discoveryv1.LabelServiceName: svc, discoveryv1.LabelManagedBy: "e2e-userspace"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("tcp"), Port: ptr(port), Protocol: ptr(corev1.ProtocolTCP)}},
	}
	for _, p := range pods {
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{harness.PodIP(p)},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)},
			NodeName:   ptr(b.Node),
		})
	}
	ctx, cancel := b.Ctx()
	defer cancel()
	api := b.Cluster.Admin.DiscoveryV1().EndpointSlices(b.NS)
	old, err := api.Get(ctx, slice.Name, metav1.GetOptions{})
	if err == nil {
		slice.ResourceVersion = old.ResourceVersion
		_, err = api.Update(ctx, slice, metav1.UpdateOptions{})
	} else {
		_, err = api.Create(ctx, slice, metav1.CreateOptions{})
	}
	if err != nil {
		t.Fatalf("writing EndpointSlice of %s: %v", svc, err)
	}
}

func ptr[T any](v T) *T { return &v }

// lineServer serves TCP in pod i's namespace on port: it answers every line it reads with
// "pod<i> <client address>" and keeps the connection open until the client closes it. It counts
// connections. With oneShot it answers once, before reading, and half-closes, as the bed's pod
// servers do (for harness.Hit).
type lineServer struct {
	ln    net.Listener
	mu    sync.Mutex
	conns int
}

func startLineServer(t testing.TB, b *bed, pod int, port int32, oneShot bool) *lineServer {
	t.Helper()
	ln, err := b.Topo.Pods[pod-1].NS.Listen("tcp", ":"+strconv.Itoa(int(port)))
	if err != nil {
		t.Fatalf("listening in pod%d: %v", pod, err)
	}
	s := &lineServer{ln: ln}
	t.Cleanup(func() { _ = ln.Close() })
	name := "pod" + strconv.Itoa(pod)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns++
			s.mu.Unlock()
			go func() {
				defer c.Close()
				if oneShot {
					fmt.Fprintf(c, "%s %s\n", name, c.RemoteAddr())
					_ = c.(*net.TCPConn).CloseWrite()
					_, _ = io.Copy(io.Discard, c)
					return
				}
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					if _, err := fmt.Fprintf(c, "%s %s\n", name, c.RemoteAddr()); err != nil {
						return
					}
				}
			}()
		}
	}()
	return s
}

// longConn is a TCP connection that asks repeatedly.
type longConn struct {
	c net.Conn
	r *bufio.Reader
}

func dialLong(t testing.TB, from *harness.NetNS, addr string) *longConn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := from.DialContext(ctx, "tcp", addr)
	if err != nil {
		t.Fatalf("connecting to %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &longConn{c: c, r: bufio.NewReader(c)}
}

// ask sends a line and returns the answering pod's name, or the error.
func (l *longConn) ask() (string, error) {
	_ = l.c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := io.WriteString(l.c, "again\n"); err != nil {
		return "", err
	}
	line, err := l.r.ReadString('\n')
	if err != nil {
		return "", err
	}
	name, _, _ := strings.Cut(line, " ")
	return name, nil
}

func newReader(c net.Conn) *bufio.Reader { return bufio.NewReader(c) }

func formatFloat(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
