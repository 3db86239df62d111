package daemon

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kube-proxy/e2e/harness"
)

// nodeEvents waits until the real API server holds Events about node with every reason in want, and
// returns them by reason.
func nodeEvents(t *testing.T, c *harness.Cluster, node string, want ...string) map[string]eventsv1.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		l, err := c.Admin.EventsV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "regarding.name=" + node})
		got := map[string]eventsv1.Event{}
		if err == nil {
			for _, e := range l.Items {
				got[e.Reason] = e
			}
		}
		missing := false
		for _, r := range want {
			if _, ok := got[r]; !ok {
				missing = true
			}
		}
		if !missing {
			return got
		}
		select {
		case <-ctx.Done():
			t.Fatalf("events about node %s: have %v (list error %v), want %v", node, keys(got), err, want)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func keys(m map[string]eventsv1.Event) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestEvents: started as system:kube-proxy (RBAC system:node-proxier only) with no mode in its config, the
// daemon records upstream's Events about its Node in events.k8s.io: the warning that the default mode
// changes in 1.40 (which upstream v1.37.2 logs but, recording it before its broadcaster runs, never
// writes), then Starting. With bindAddressHardFail and its health port taken, it writes
// FailedToStartProxierHealthcheck before it exits.
func TestEvents(t *testing.T) {
	c := harness.SharedCluster(t)
	hostname, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}

	t.Run("start", func(t *testing.T) {
		harness.EnsureNode(t, c, "node-ev", "192.0.2.21", "", nil)
		ns := harness.NetNSForTest(t, "ev")
		harness.StartDaemon(t, c, ns, harness.DaemonOptions{NodeName: "node-ev"})
		got := nodeEvents(t, c, "node-ev", "KubeProxyDefaultMode", "Starting")
		for reason, typ := range map[string]string{"KubeProxyDefaultMode": corev1.EventTypeWarning, "Starting": corev1.EventTypeNormal} {
			e := got[reason]
			if e.Type != typ || e.ReportingController != "kube-proxy" || e.ReportingInstance != "kube-proxy-"+hostname ||
				e.Action != "StartKubeProxy" || e.Regarding != (corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: "node-ev"}) ||
				!strings.HasPrefix(e.Name, "node-ev.") {
				t.Errorf("%s event: %+v", reason, e)
			}
		}
		if note := got["KubeProxyDefaultMode"].Note; !strings.Contains(note, "in Kubernetes 1.40 the default mode will switch to 'nftables'") {
			t.Errorf("KubeProxyDefaultMode note %q", note)
		}
	})

	t.Run("health port taken", func(t *testing.T) {
		harness.EnsureNode(t, c, "node-ev-busy", "192.0.2.22", "", nil)
		ns := harness.NetNSForTest(t, "evbusy")
		busy, err := ns.Listen("tcp", "127.0.0.1:10256")
		if err != nil {
			t.Fatal(err)
		}
		defer busy.Close()
		d := harness.StartDaemon(t, c, ns, harness.DaemonOptions{NodeName: "node-ev-busy", NoWaitReady: true,
			Config: "mode: iptables\nbindAddressHardFail: true\n"})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := d.Proc.Wait(ctx); err == nil {
			t.Fatal("kube-proxy exited 0 with its health port taken and bindAddressHardFail set")
		}
		// Written before the process exited: no waiting here.
		l, err := c.Admin.EventsV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "regarding.name=node-ev-busy"})
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, e := range l.Items {
			switch e.Reason {
			case "FailedToStartProxierHealthcheck":
				found = e.Type == corev1.EventTypeWarning && strings.Contains(e.Note, "address already in use")
			case "KubeProxyDefaultMode":
				t.Errorf("a default-mode warning with mode: iptables set")
			}
		}
		if !found {
			t.Errorf("no FailedToStartProxierHealthcheck warning about node-ev-busy among %d events; log:\n%s", len(l.Items), d.Proc.LogTail(30))
		}
	})
}
