package userspace

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"kube-proxy/e2e/harness"
)

// TestReload: a live reload changes the capture rules (iptables.localhostNodePorts off keeps NodePorts off
// 127.0.0.1, on again serves them) while the listeners, and an established connection, keep running.
func TestReload(t *testing.T) {
	b := newBed(t, 2)
	web := b.CreateService(t, "web", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort })
	b.SetEndpoints(t, "web", harness.ReadyEndpoint(1), harness.ReadyEndpoint(2))
	long := b.createPortService(t, "long", 91, longPort)
	b.setPortEndpoints(t, "long", longPort, 1)
	startLineServer(t, b, 1, longPort, false)
	d := b.start("")
	node := b.Topo.Node
	np := harness.NodePortOf(t, web, "tcp")
	loopback, nodeIP := harness.HostPort("127.0.0.1", np), harness.HostPort(harness.NodeIP, np)
	conn := dialLong(t, b.Topo.Client, harness.HostPort(long.Spec.ClusterIP, 91))
	if _, err := conn.ask(); err != nil {
		t.Fatal(err)
	}
	bin, err := harness.DaemonBinary()
	if err != nil {
		t.Fatal(err)
	}
	reload := func(extra string) {
		t.Helper()
		d.WriteConfig(baseConfig + extra)
		cmd := exec.Command(bin, "reload", strconv.Itoa(d.Proc.PID()))
		cmd.Env = append(os.Environ(), "RUNTIME_DIRECTORY="+d.RuntimeDir)
		out, err := cmd.CombinedOutput()
		t.Logf("kube-proxy reload: %s", strings.TrimSpace(string(out)))
		if err != nil {
			t.Fatalf("kube-proxy reload: %v", err)
		}
	}
	const n = 10
	harness.ExpectSpread(t, "node -> 127.0.0.1 NodePort", harness.HitForTest(t, node, "tcp", loopback, n, harness.HitOptions{}), harness.PodNames(1, 2), harness.GatewayOf)

	reload("  localhostNodePorts: false\n")
	harness.Eventually(t, "localhost NodePorts to stop", 10*time.Second, func() (bool, string) {
		counts := harness.CountHits(harness.HitForTest(t, node, "tcp", loopback, 3, harness.HitOptions{Timeout: time.Second}))
		return counts["ERR:refused"] == 3, harness.FormatHits(counts)
	})
	harness.ExpectSpread(t, "node -> NodeIP NodePort", harness.HitForTest(t, node, "tcp", nodeIP, n, harness.HitOptions{}), harness.PodNames(1, 2), harness.GatewayOf)

	reload("")
	harness.Eventually(t, "localhost NodePorts to answer again", 10*time.Second, func() (bool, string) {
		counts := harness.CountHits(harness.HitForTest(t, node, "tcp", loopback, 3, harness.HitOptions{Timeout: time.Second}))
		return counts["pod1"]+counts["pod2"] == 3, harness.FormatHits(counts)
	})
	if got, err := conn.ask(); err != nil || got != "pod1" {
		t.Errorf("the established connection after two reloads: %q, %v", got, err)
	}
}
