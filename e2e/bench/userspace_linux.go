package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"kube-proxy/e2e/harness"
)

// The userspace benchmark's Services, all with pod 1 as their one endpoint: "web" answers each connection
// once (the pod server), "echo" echoes what it reads on a connection kept open, "sink" reads a stream to its
// end and answers with the byte count.
const (
	usNS       = "bench-userspace"
	usWebPort  = 80
	usEchoPort = 90
	usSinkPort = 91
	usEchoPod  = 9000
	usSinkPod  = 9001
)

// usResult is one mode's figures (and the direct path's, to pod 1's IP, measured beside them).
type usResult struct {
	Mode string
	// ConnRate is new connections per second (connect, one request, answer, close) with usWorkers in parallel.
	ConnRate, DirectConnRate float64
	// ConnFailed and DirectConnFailed count the connections of the rate measurement that failed.
	ConnFailed, DirectConnFailed int
	// Connect p50/p99: one new connection with its request and answer, one at a time.
	ConnP50, ConnP99, DirectConnP50, DirectConnP99 time.Duration
	// RTT p50/p99: a 64-byte request and its echo on an open connection.
	RTTP50, RTTP99, DirectRTTP50, DirectRTTP99 time.Duration
	// Throughput of one TCP stream, MB/s (10^6 bytes).
	Throughput, DirectThroughput float64
	// RSS of the daemon before and with usIdle idle connections open through it.
	RSSBefore, RSSIdle int64
	IdleOpen           int
}

const (
	usWorkers     = 4
	usRateFor     = 5 * time.Second
	usConnects    = 1000
	usRTTs        = 5000
	usStreamBytes = 512 << 20
	usIdle        = 10000
)

// runUserspace measures mode userspace's data plane beside mode iptables': the same Services, the same
// client namespace, one daemon of ours in each mode on a fresh node; and the direct path to the pod's IP
// through the same node, which no rule touches. It writes BENCHMARKS.md's mode userspace section.
func runUserspace(ctx context.Context, o options) error {
	if os.Geteuid() != 0 {
		return errors.New("run as root: the benchmark creates network namespaces (it never touches the host's own rules)")
	}
	// Idle connections hold two descriptors each here (both ends) and two in mode userspace's daemon, which
	// inherits this process's limit and takes (limit - 1,024) / 2 as its connection cap: below 10,000
	// idle connections are measured up to that cap.
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return err
	}
	idle := min(usIdle, (int(lim.Max)-1024)/2-100)
	logf("descriptor limit %d: %d idle connections", lim.Max, idle)
	if _, err := harness.DaemonBinary(); err != nil {
		return err
	}
	if _, err := harness.BuildPodServer(); err != nil {
		return err
	}
	outdir := filepath.Join(o.Outdir, "userspace-"+time.Now().UTC().Format("20060102-150405"))
	if err := os.MkdirAll(outdir, 0o755); err != nil {
		return err
	}
	logf("userspace data-plane benchmark; logs in %s", outdir)
	c, err := harness.StartCluster(ctx, filepath.Join(outdir, "cluster"))
	if err != nil {
		return err
	}
	defer c.Stop()
	ips, err := usWorkload(ctx, c)
	if err != nil {
		return err
	}
	var results []usResult
	for _, mode := range []string{"iptables", "userspace"} {
		quiesce(o.Quiesce)
		r, err := usMeasure(ctx, c, ips, mode, filepath.Join(outdir, mode), idle)
		if err != nil {
			return fmt.Errorf("mode %s: %w", mode, err)
		}
		results = append(results, r)
	}
	m := describeMachine(map[string]string{})
	text := usReport(results, m, o)
	fmt.Print(text)
	if o.Output == "" {
		return nil
	}
	doc, err := os.ReadFile(o.Output)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	if err := os.WriteFile(o.Output, []byte(usUpdate(string(doc), text)), 0o644); err != nil {
		return err
	}
	logf("wrote %s", o.Output)
	return nil
}

const (
	usBegin = "<!-- bench:begin userspace -->"
	usEnd   = "<!-- bench:end userspace -->"
)

// usUpdate puts text between the userspace markers of doc, or appends it with them.
func usUpdate(doc, text string) string {
	block := usBegin + "\n" + text + usEnd
	if i, j := strings.Index(doc, usBegin), strings.Index(doc, usEnd); i >= 0 && j > i {
		return doc[:i] + block + doc[j+len(usEnd):]
	}
	if doc != "" && !strings.HasSuffix(doc, "\n") {
		doc += "\n"
	}
	return doc + "\n" + block + "\n"
}

// usWorkload creates the namespace, the Node and the three Services with their EndpointSlices, and
// returns the Services' cluster IPs by name.
func usWorkload(ctx context.Context, c *harness.Cluster) (map[string]string, error) {
	cs := c.Admin
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: usNS}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	if err := harness.ApplyNode(ctx, c, nodeName, harness.NodeIP, harness.PodCIDR, nil); err != nil {
		return nil, err
	}
	ips := map[string]string{}
	for _, s := range []struct {
		name      string
		port, pod int32
	}{{"web", usWebPort, podPort}, {"echo", usEchoPort, usEchoPod}, {"sink", usSinkPort, usSinkPod},
		// Idle connections are spread over four Services: mode userspace lets one Service port hold at
		// most half of the connections its descriptor budget allows.
		{"idle0", usEchoPort, usEchoPod}, {"idle1", usEchoPort, usEchoPod}, {"idle2", usEchoPort, usEchoPod}, {"idle3", usEchoPort, usEchoPod}} {
		svc, err := cs.CoreV1().Services(usNS).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: usNS},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "tcp", Port: s.port, Protocol: corev1.ProtocolTCP,
				TargetPort: intstr.FromInt32(s.pod)}}},
		}, metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("creating Service %s: %w", s.name, err)
		}
		ips[s.name] = svc.Spec.ClusterIP
		t, name := true, "tcp"
		proto := corev1.ProtocolTCP
		node := nodeName
		_, err = cs.DiscoveryV1().EndpointSlices(usNS).Create(ctx, &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: usNS,
				Labels: map[string]string{discoveryv1.LabelServiceName: s.name}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &s.pod, Protocol: &proto}},
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{harness.PodIP(1)}, NodeName: &node,
				Conditions: discoveryv1.EndpointConditions{Ready: &t, Serving: &t}}},
		}, metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("creating EndpointSlice %s: %w", s.name, err)
		}
	}
	return ips, nil
}

// usMeasure runs one mode on a fresh node and measures it and the direct path.
func usMeasure(ctx context.Context, c *harness.Cluster, ips map[string]string, mode, dir string, idleConns int) (r usResult, err error) {
	r.Mode = mode
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return r, err
	}
	topo, err := harness.NewTopology(ctx, 1)
	if err != nil {
		return r, err
	}
	defer topo.Close()
	if err := topo.StartServers(ctx, []int{podPort}, nil); err != nil {
		return r, err
	}
	pod := topo.Pods[0].NS
	stopServers, err := usServers(pod)
	if err != nil {
		return r, err
	}
	defer stopServers()
	xt, err := harness.NewXTables(topo.Node, harness.BackendNFT, dir)
	if err != nil {
		return r, err
	}
	if err := xt.SetHint(ctx); err != nil {
		return r, err
	}
	kubeconfig, stopBridge, err := c.Bridge(topo.Node)
	if err != nil {
		return r, err
	}
	defer stopBridge()
	d, err := harness.LaunchDaemon(topo.Node, dir, harness.DaemonOptions{NodeName: nodeName, Kubeconfig: kubeconfig,
		Config: "mode: " + mode + "\nclusterCIDR: " + harness.PodCIDR + "\n", Env: []string{xt.Env()}})
	if err != nil {
		return r, err
	}
	defer d.Close()

	client := topo.Client
	svc := func(name string, port int) netip.AddrPort {
		return netip.AddrPortFrom(netip.MustParseAddr(ips[name]), uint16(port))
	}
	direct := func(port int) netip.AddrPort {
		return netip.AddrPortFrom(netip.MustParseAddr(harness.PodIP(1)), uint16(port))
	}
	if hits, err := harness.Hit(ctx, client, "tcp", svc("web", usWebPort).String(), 3); err != nil || hits["pod1"] != 3 {
		return r, fmt.Errorf("the web Service does not answer: %v %s", err, harness.FormatHits(hits))
	}
	logf("mode %s: measuring", mode)
	if r.ConnRate, r.ConnFailed, err = usConnRate(client, svc("web", usWebPort)); err != nil {
		return r, err
	}
	if r.DirectConnRate, r.DirectConnFailed, err = usConnRate(client, direct(podPort)); err != nil {
		return r, err
	}
	if r.ConnP50, r.ConnP99, err = usConnLatency(client, svc("web", usWebPort)); err != nil {
		return r, err
	}
	if r.DirectConnP50, r.DirectConnP99, err = usConnLatency(client, direct(podPort)); err != nil {
		return r, err
	}
	if r.RTTP50, r.RTTP99, err = usRTT(client, svc("echo", usEchoPort)); err != nil {
		return r, err
	}
	if r.DirectRTTP50, r.DirectRTTP99, err = usRTT(client, direct(usEchoPod)); err != nil {
		return r, err
	}
	if r.Throughput, err = usStream(client, svc("sink", usSinkPort)); err != nil {
		return r, err
	}
	if r.DirectThroughput, err = usStream(client, direct(usSinkPod)); err != nil {
		return r, err
	}
	time.Sleep(2 * time.Second)
	before, err := readMemory(d.Proc.PID())
	if err != nil {
		return r, err
	}
	r.RSSBefore = before.RSS
	logf("mode %s: daemon has %d descriptors open, limit %q", mode, openFDs(d.Proc.PID()), nofileLimit(d.Proc.PID()))
	conns, err := usOpenIdle(client, []netip.AddrPort{svc("idle0", usEchoPort), svc("idle1", usEchoPort),
		svc("idle2", usEchoPort), svc("idle3", usEchoPort)}, idleConns)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	r.IdleOpen = len(conns)
	if err != nil {
		return r, err
	}
	time.Sleep(2 * time.Second)
	idle, err := readMemory(d.Proc.PID())
	if err != nil {
		return r, err
	}
	r.RSSIdle = idle.RSS
	logf("mode %s: %.0f conn/s (direct %.0f), connect p50 %v p99 %v, rtt p50 %v p99 %v, %.0f MB/s (direct %.0f), RSS %d -> %d MiB with %d idle",
		mode, r.ConnRate, r.DirectConnRate, r.ConnP50, r.ConnP99, r.RTTP50, r.RTTP99, r.Throughput, r.DirectThroughput,
		r.RSSBefore>>20, r.RSSIdle>>20, r.IdleOpen)
	return r, nil
}

// usServers serves echo and sink in the pod's namespace (the sockets live there; the goroutines here).
func usServers(pod *harness.NetNS) (stop func(), err error) {
	echo, err := pod.Listen("tcp", ":"+strconv.Itoa(usEchoPod))
	if err != nil {
		return nil, err
	}
	sink, err := pod.Listen("tcp", ":"+strconv.Itoa(usSinkPod))
	if err != nil {
		_ = echo.Close()
		return nil, err
	}
	var mu sync.Mutex
	var open []net.Conn
	serve := func(ln net.Listener, handle func(net.Conn)) {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			open = append(open, c)
			mu.Unlock()
			go handle(c)
		}
	}
	go serve(echo, func(c net.Conn) {
		buf := make([]byte, 512)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			if _, err := c.Write(buf[:n]); err != nil {
				return
			}
		}
	})
	go serve(sink, func(c net.Conn) {
		n, _ := io.Copy(io.Discard, c)
		fmt.Fprintf(c, "%d\n", n)
		_ = c.Close()
	})
	return func() {
		_ = echo.Close()
		_ = sink.Close()
		mu.Lock()
		for _, c := range open {
			_ = c.Close()
		}
		mu.Unlock()
	}, nil
}

// usAsk makes one connection to the pod server behind addr: request, answer, close.
func usAsk(addr netip.AddrPort) error {
	c, err := net.DialTimeout("tcp", addr.String(), 2*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("hit\n")); err != nil {
		return err
	}
	_ = c.(*net.TCPConn).CloseWrite()
	b, err := io.ReadAll(c)
	if err == nil && len(b) == 0 {
		err = errors.New("no answer")
	}
	return err
}

// usConnRate makes connections with usWorkers workers for usRateFor and returns the completed ones per
// second, and how many failed (each failure is waited out: up to its 2 s timeout).
func usConnRate(from *harness.NetNS, addr netip.AddrPort) (float64, int, error) {
	var done, failed atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, usWorkers)
	start := time.Now()
	end := start.Add(usRateFor)
	for range usWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- from.Do(func() error {
				for time.Now().Before(end) {
					if err := usAsk(addr); err != nil {
						if failed.Add(1) == 1 {
							logf("connection rate to %v: first failure after %d connections: %v", addr, done.Load(), err)
						}
						continue
					}
					done.Add(1)
				}
				return nil
			})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return 0, 0, fmt.Errorf("connection rate to %v: %w", addr, err)
		}
	}
	return float64(done.Load()) / time.Since(start).Seconds(), int(failed.Load()), nil
}

// usConnLatency times usConnects connections one at a time (after 50 unmeasured ones).
func usConnLatency(from *harness.NetNS, addr netip.AddrPort) (p50, p99 time.Duration, err error) {
	var d []time.Duration
	err = from.Do(func() error {
		for i := range usConnects + 50 {
			start := time.Now()
			if err := usAsk(addr); err != nil {
				return err
			}
			if i >= 50 {
				d = append(d, time.Since(start))
			}
		}
		return nil
	})
	return percentile(d, 0.5), percentile(d, 0.99), err
}

// usRTT times usRTTs 64-byte exchanges on one connection to an echo server (after 100 unmeasured ones).
func usRTT(from *harness.NetNS, addr netip.AddrPort) (p50, p99 time.Duration, err error) {
	var d []time.Duration
	err = from.Do(func() error {
		c, err := net.DialTimeout("tcp", addr.String(), 2*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		msg, buf := make([]byte, 64), make([]byte, 64)
		for i := range usRTTs + 100 {
			start := time.Now()
			if _, err := c.Write(msg); err != nil {
				return err
			}
			if _, err := io.ReadFull(c, buf); err != nil {
				return err
			}
			if i >= 100 {
				d = append(d, time.Since(start))
			}
		}
		return nil
	})
	return percentile(d, 0.5), percentile(d, 0.99), err
}

// usStream sends usStreamBytes on one connection to a sink and returns MB/s, from the first byte written
// to the sink's count read back.
func usStream(from *harness.NetNS, addr netip.AddrPort) (float64, error) {
	var mbps float64
	err := from.Do(func() error {
		c, err := net.DialTimeout("tcp", addr.String(), 2*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 256<<10)
		start := time.Now()
		for sent := 0; sent < usStreamBytes; sent += len(buf) {
			if _, err := c.Write(buf); err != nil {
				return err
			}
		}
		_ = c.(*net.TCPConn).CloseWrite()
		b, err := io.ReadAll(c)
		if err != nil {
			return err
		}
		if got := strings.TrimSpace(string(b)); got != strconv.Itoa(usStreamBytes) {
			return fmt.Errorf("sink counted %q bytes, want %d", got, usStreamBytes)
		}
		mbps = float64(usStreamBytes) / 1e6 / time.Since(start).Seconds()
		return nil
	})
	return mbps, err
}

// usOpenIdle opens n connections to echo servers, round-robin over addrs, checks each with one exchange,
// and leaves them open.
func usOpenIdle(from *harness.NetNS, addrs []netip.AddrPort, n int) ([]net.Conn, error) {
	var conns []net.Conn
	err := from.Do(func() error {
		buf := make([]byte, 1)
		for i := range n {
			c, err := net.DialTimeout("tcp", addrs[i%len(addrs)].String(), 5*time.Second)
			if err != nil {
				return err
			}
			conns = append(conns, c)
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.Write([]byte{1}); err != nil {
				return err
			}
			if _, err := io.ReadFull(c, buf); err != nil {
				return err
			}
			_ = c.SetDeadline(time.Time{})
		}
		return nil
	})
	if err != nil {
		err = fmt.Errorf("after %d idle connections: %w", len(conns), err)
	}
	return conns, err
}

// usReport renders the section.
func usReport(rs []usResult, m machineInfo, o options) string {
	var b strings.Builder
	fmt.Fprintf(&b, "## Mode userspace: what the daemon's own proxy costs\n\n")
	fmt.Fprintf(&b, "Written by `%s` on %s. One Service, one endpoint (a pod behind the node, over veth); a client\n", o.Command, m.oneLine())
	fmt.Fprintf(&b, "namespace connects to the cluster IP, and directly to the pod's IP through the same node for the\n")
	fmt.Fprintf(&b, "\"direct\" columns. Each mode ran alone on a fresh node; in mode iptables the kernel DNATs, in mode\n")
	fmt.Fprintf(&b, "userspace every byte passes through the daemon (splice between its two sockets).\n\n")
	fmt.Fprintf(&b, "| | mode iptables | mode userspace | direct to the pod |\n|---|---|---|---|\n")
	ipt, us := rs[0], rs[1]
	ms := func(d time.Duration) string { return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond)) }
	fmt.Fprintf(&b, "| new connections per second (%d clients, connect + request + answer + close; failed) | %.0f (%d) | %.0f (%d) | %.0f (%d) |\n",
		usWorkers, ipt.ConnRate, ipt.ConnFailed, us.ConnRate, us.ConnFailed, ipt.DirectConnRate, ipt.DirectConnFailed)
	fmt.Fprintf(&b, "| one new connection with its answer, p50 / p99 | %s / %s | %s / %s | %s / %s |\n",
		ms(ipt.ConnP50), ms(ipt.ConnP99), ms(us.ConnP50), ms(us.ConnP99), ms(ipt.DirectConnP50), ms(ipt.DirectConnP99))
	fmt.Fprintf(&b, "| 64-byte request and echo on an open connection, p50 / p99 | %s / %s | %s / %s | %s / %s |\n",
		ms(ipt.RTTP50), ms(ipt.RTTP99), ms(us.RTTP50), ms(us.RTTP99), ms(ipt.DirectRTTP50), ms(ipt.DirectRTTP99))
	fmt.Fprintf(&b, "| latency added to an exchange on an open connection, p50 (vs direct) | %s | %s | |\n",
		ms(ipt.RTTP50-ipt.DirectRTTP50), ms(us.RTTP50-us.DirectRTTP50))
	fmt.Fprintf(&b, "| one TCP stream, %d MiB, MB/s | %.0f | %.0f | %.0f |\n", usStreamBytes>>20, ipt.Throughput, us.Throughput, ipt.DirectThroughput)
	fmt.Fprintf(&b, "| daemon RSS, MiB: before / with %d idle connections (over 4 Services) | %.1f / %.1f | %.1f / %.1f | |\n\n", us.IdleOpen,
		float64(ipt.RSSBefore)/(1<<20), float64(ipt.RSSIdle)/(1<<20), float64(us.RSSBefore)/(1<<20), float64(us.RSSIdle)/(1<<20))
	if us.IdleOpen < usIdle {
		fmt.Fprintf(&b, "%d idle connections, not %d: this host's descriptor limit (its hard RLIMIT_NOFILE, which the\n", us.IdleOpen, usIdle)
		fmt.Fprintf(&b, "benchmark cannot raise) caps mode userspace's connections at about (limit - 1,024) / 2.\n\n")
	}
	fmt.Fprintf(&b, "In mode iptables idle connections cost the daemon nothing (the kernel's conntrack holds them); in mode\n")
	fmt.Fprintf(&b, "userspace each holds two sockets and a goroutine pair in the daemon. The direct path was measured\n")
	fmt.Fprintf(&b, "in both runs; the table shows mode iptables' run (mode userspace's: %.0f conn/s, p50 %s, %.0f MB/s).\n\n",
		us.DirectConnRate, ms(us.DirectRTTP50), us.DirectThroughput)
	return b.String()
}

// openFDs counts a process's open descriptors (-1 when unreadable).
func openFDs(pid int) int {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return -1
	}
	return len(ents)
}

// nofileLimit returns a process's "Max open files" line from /proc/<pid>/limits.
func nofileLimit(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "Max open files") {
			return strings.Join(strings.Fields(strings.TrimPrefix(l, "Max open files")), " ")
		}
	}
	return ""
}
