package userspace

import (
	"context"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"kube-proxy/e2e/harness"
)

const longPort = 9001

// TestEndpointRemovalDrains: a long-lived connection to an endpoint that is removed from its Service
// keeps working (counted as draining) while new connections go to the remaining endpoint; when it ends,
// it is counted as drained.
func TestEndpointRemovalDrains(t *testing.T) {
	b := newBed(t, 2)
	svc := b.createPortService(t, "long", 91, longPort)
	b.setPortEndpoints(t, "long", longPort, 1, 2)
	startLineServer(t, b, 1, longPort, false)
	startLineServer(t, b, 2, longPort, false)
	d := b.start("")
	addr := harness.HostPort(svc.Spec.ClusterIP, 91)

	long := dialLong(t, b.Topo.Client, addr)
	first, err := long.ask()
	if err != nil {
		t.Fatalf("long-lived connection: %v", err)
	}
	keep := 1
	if first == "pod1" {
		keep = 2
	}
	b.setPortEndpoints(t, "long", longPort, keep)
	harness.Eventually(t, "the removal to be synced", 10*time.Second, func() (bool, string) {
		v, _ := d.Metric(t, "kubeproxy_userspace_connections_draining", `protocol="TCP"`)
		return v == 1, "draining connections: " + formatFloat(v)
	})
	for range 10 {
		c := dialLong(t, b.Topo.Client, addr)
		if got, err := c.ask(); err != nil || got != harness.PodNames(keep)[0] {
			t.Fatalf("new connection after the removal: %q, %v; want pod%d", got, err, keep)
		}
		_ = c.c.Close()
	}
	for range 3 {
		if got, err := long.ask(); err != nil || got != first {
			t.Fatalf("the established connection after its endpoint's removal: %q, %v; want %s", got, err, first)
		}
	}
	_ = long.c.Close()
	harness.Eventually(t, "the drain to be counted", 10*time.Second, func() (bool, string) {
		draining, _ := d.Metric(t, "kubeproxy_userspace_connections_draining", `protocol="TCP"`)
		drained, _ := d.Metric(t, "kubeproxy_userspace_connections_drained_total", `protocol="TCP"`)
		return draining == 0 && drained == 1, "draining " + formatFloat(draining) + ", drained " + formatFloat(drained)
	})
}

// TestRestart: established connections end when the daemon stops (its sockets were their only path);
// new connections work again once the restarted daemon has synced, and the UDP flow of a client that
// kept its socket moves to the new listener.
func TestRestart(t *testing.T) {
	b := newBed(t, 2)
	svc := b.createPortService(t, "long", 91, longPort)
	b.setPortEndpoints(t, "long", longPort, 1, 2)
	startLineServer(t, b, 1, longPort, false)
	startLineServer(t, b, 2, longPort, false)
	web := b.CreateService(t, "web", nil)
	b.SetEndpoints(t, "web", harness.ReadyEndpoint(1), harness.ReadyEndpoint(2))
	d := b.start("")
	addr := harness.HostPort(svc.Spec.ClusterIP, 91)
	long := dialLong(t, b.Topo.Client, addr)
	if _, err := long.ask(); err != nil {
		t.Fatal(err)
	}
	flow := harness.NewUDPFlow(t, b.Topo.Client, harness.HostPort(web.Spec.ClusterIP, svcUDP))
	if flow.Ask() == "" {
		t.Fatal("no UDP answer before the restart")
	}

	stopped := time.Now()
	if err := d.Proc.Stop(syscall.SIGTERM, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if got, err := long.ask(); err == nil {
		t.Errorf("established connection still answered (%s) with the daemon stopped", got)
	}
	d.Start()
	ready := time.Since(stopped)
	var firstOK time.Duration
	harness.Eventually(t, "new connections after the restart", 30*time.Second, func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		c, err := b.Topo.Client.DialContext(ctx, "tcp", addr)
		if err != nil {
			return false, err.Error()
		}
		defer c.Close()
		l := &longConn{c: c, r: newReader(c)}
		if _, err := l.ask(); err != nil {
			return false, err.Error()
		}
		firstOK = time.Since(stopped)
		return true, ""
	})
	t.Logf("daemon stopped, restarted and ready after %v; first new connection answered %v after the stop",
		ready.Round(time.Millisecond), firstOK.Round(time.Millisecond))
	// The UDP client kept its socket, so its conntrack entry still pointed at the old listener's port:
	// the restarted daemon deletes such entries, and the flow's next datagram finds the new listener.
	harness.Eventually(t, "the UDP flow to be answered again", 10*time.Second, func() (bool, string) {
		return flow.Ask() != "", "no answer"
	})
}

// TestCleanup: `kube-proxy --cleanup` removes mode userspace's chains and jumps and nothing else.
func TestCleanup(t *testing.T) {
	b := newBed(t, 1)
	b.CreateService(t, "web", nil)
	b.SetEndpoints(t, "web", harness.ReadyEndpoint(1))
	d := b.start("")
	if err := d.Proc.Stop(syscall.SIGTERM, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, ok := b.save(t, "nat").Chains["KUBE-PORTALS-CONTAINER"]; !ok {
		t.Fatal("no KUBE-PORTALS-CONTAINER before cleanup")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A rule of the admin's own, which must survive.
	if _, err := b.xt.Run(ctx, false, "", "-t", "filter", "-A", "INPUT", "-p", "tcp", "--dport", "22", "-j", "ACCEPT"); err != nil {
		t.Fatal(err)
	}
	bin, err := harness.DaemonBinary()
	if err != nil {
		t.Fatal(err)
	}
	out, err := b.Topo.Node.RunEnv(ctx, []string{b.xt.Env()}, bin, "--cleanup", "--v=2")
	t.Logf("kube-proxy --cleanup:\n%s", out)
	if err != nil {
		t.Fatalf("kube-proxy --cleanup: %v", err)
	}
	for table, chains := range map[string][]string{"nat": natChains, "filter": filterChains} {
		tab := b.save(t, table)
		for _, c := range chains {
			if _, ok := tab.Chains[c]; ok {
				t.Errorf("--cleanup left %s/%s", table, c)
			}
		}
		for _, r := range tab.Rules {
			if strings.Contains(r, "-j KUBE-") {
				t.Errorf("--cleanup left %s", r)
			}
		}
	}
	if !slices.Contains(b.save(t, "filter").RulesOf("INPUT"), "-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT") {
		t.Error("--cleanup removed the admin's own INPUT rule")
	}
}

// TestSwitchFromIPTables: a node that ran mode iptables is switched to mode userspace; Services keep
// working, and once the userspace daemon has synced mode iptables' chains are gone.
func TestSwitchFromIPTables(t *testing.T) {
	b := newBed(t, 2)
	web := b.CreateService(t, "web", nil)
	b.SetEndpoints(t, "web", harness.ReadyEndpoint(1), harness.ReadyEndpoint(2))
	ipt := harness.StartDaemon(t, b.Cluster, b.Topo.Node, harness.DaemonOptions{
		NodeName: b.Node, Config: "mode: iptables\nclusterCIDR: " + harness.PodCIDR + "\n",
		Env: []string{b.xt.Env()}, Kubeconfig: b.Kubeconfig})
	if _, ok := b.save(t, "nat").Chains["KUBE-SERVICES"]; !ok {
		t.Fatal("mode iptables wrote no KUBE-SERVICES")
	}
	if err := ipt.Proc.Stop(syscall.SIGTERM, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	d := b.start("")
	harness.Eventually(t, "mode iptables' chains to be removed", 30*time.Second, func() (bool, string) {
		var left []string
		for c := range b.save(t, "nat").Chains {
			if strings.HasPrefix(c, "KUBE-SVC-") || strings.HasPrefix(c, "KUBE-SEP-") || c == "KUBE-SERVICES" {
				left = append(left, c)
			}
		}
		return len(left) == 0, strings.Join(left, " ")
	})
	before, _ := d.Metric(t, "kubeproxy_userspace_connections_accepted_total", `protocol="TCP"`)
	addr := harness.HostPort(web.Spec.ClusterIP, svcTCP)
	harness.ExpectSpread(t, "client -> web", harness.HitForTest(t, b.Topo.Client, "tcp", addr, 20, harness.HitOptions{}), harness.PodNames(1, 2), harness.GatewayOf)
	if after, _ := d.Metric(t, "kubeproxy_userspace_connections_accepted_total", `protocol="TCP"`); after-before != 20 {
		t.Errorf("the userspace proxy accepted %v of 20 connections", after-before)
	}
}

// TestSwitchToOtherModes: a node that ran mode userspace is switched to mode iptables, then (from
// userspace again) to mode nftables; once the new mode has synced, no capture chain or jump is left and
// Services work through the new mode.
func TestSwitchToOtherModes(t *testing.T) {
	for _, mode := range []string{"iptables", "nftables"} {
		t.Run(mode, func(t *testing.T) {
			b := newBed(t, 2)
			web := b.CreateService(t, "web", nil)
			b.SetEndpoints(t, "web", harness.ReadyEndpoint(1), harness.ReadyEndpoint(2))
			d := b.start("")
			if _, ok := b.save(t, "nat").Chains["KUBE-PORTALS-CONTAINER"]; !ok {
				t.Fatal("mode userspace wrote no KUBE-PORTALS-CONTAINER")
			}
			if err := d.Proc.Stop(syscall.SIGTERM, 5*time.Second); err != nil {
				t.Fatal(err)
			}
			harness.StartDaemon(t, b.Cluster, b.Topo.Node, harness.DaemonOptions{
				NodeName: b.Node, Config: "mode: " + mode + "\nclusterCIDR: " + harness.PodCIDR + "\n",
				Env: []string{b.xt.Env()}, Kubeconfig: b.Kubeconfig})
			harness.Eventually(t, "mode userspace's chains and jumps to be removed", 30*time.Second, func() (bool, string) {
				var left []string
				for table, chains := range map[string][]string{"nat": natChains, "filter": filterChains} {
					tab := b.save(t, table)
					for _, c := range chains {
						if _, ok := tab.Chains[c]; ok {
							left = append(left, table+"/"+c)
						}
					}
					for _, r := range tab.Rules {
						if strings.Contains(r, "-j KUBE-PORTALS-") || strings.Contains(r, "-j KUBE-NODEPORT-CONTAINER") || strings.Contains(r, "-j KUBE-NODEPORT-HOST") {
							left = append(left, r)
						}
					}
				}
				return len(left) == 0, strings.Join(left, "; ")
			})
			addr := harness.HostPort(web.Spec.ClusterIP, svcTCP)
			harness.ExpectSpread(t, "client -> web", harness.HitForTest(t, b.Topo.Client, "tcp", addr, 20, harness.HitOptions{}), harness.PodNames(1, 2), harness.GatewayOf)
		})
	}
}
