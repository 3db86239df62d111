package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"kube-proxy/proxy/apitest"

	"kube-proxy/config"
)

// reconfigDataplane is a fakeDataplane that takes reloaded configurations, or refuses them.
type reconfigDataplane struct {
	*fakeDataplane
	mu       sync.Mutex
	refuse   error
	accepted []*config.KubeProxyConfiguration
}

func (d *reconfigDataplane) Reconfigure(cfg *config.KubeProxyConfiguration) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.refuse != nil {
		return d.refuse
	}
	d.accepted = append(d.accepted, cfg)
	return nil
}

// reloadBed is a dual-stack Server with reconfigurable dataplanes, its loop running and its first sync done.
type reloadBed struct {
	s         *Server
	dp, dp6   *reconfigDataplane
	verbosity []int // every SetVerbosity call
	applied   []config.LoggingConfiguration
	applyErr  error
}

func (b *reloadBed) SetVerbosity(v int) error { b.verbosity = append(b.verbosity, v); return nil }

func (b *reloadBed) Apply(c config.LoggingConfiguration) error {
	b.applied = append(b.applied, c)
	return b.applyErr
}

func newReloadBed(t *testing.T) *reloadBed {
	t.Helper()
	b := &reloadBed{dp: &reconfigDataplane{fakeDataplane: newFakeDataplane()},
		dp6: &reconfigDataplane{fakeDataplane: newFakeDataplane()}}
	b.s = NewServer(config.Default(), nil, thisNode, prometheus.NewRegistry(),
		[]FamilyDataplane{{Family: v1.IPv4Protocol, Dataplane: b.dp}, {Family: v1.IPv6Protocol, Dataplane: b.dp6}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { b.s.Proxy.Loop(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	eventually(t, "the first sync", func() bool { return len(b.dp.snapshotCalls()) > 0 })
	return b
}

func (b *reloadBed) reload(t *testing.T, next *config.KubeProxyConfiguration) config.ReloadResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return b.reloadLoaded(ctx, next, nil, nil)
}

// reloadLoaded reloads with what Load returns: next, its warnings and a load error.
func (b *reloadBed) reloadLoaded(ctx context.Context, next *config.KubeProxyConfiguration, warnings []*config.FieldError, loadErr error) config.ReloadResult {
	b.s.Reloading = Reloading{Logs: b, Load: func() (*config.KubeProxyConfiguration, []*config.FieldError, error) {
		return next, warnings, loadErr
	}}
	return b.s.Reload(ctx)
}

// changed returns a config with live changes only: masqueradeAll, sync periods and verbosity.
func changed() *config.KubeProxyConfiguration {
	c := config.Default()
	c.IPTables.MasqueradeAll = true
	c.IPTables.SyncPeriod = metav1.Duration{Duration: 7 * time.Second}
	c.IPTables.MinSyncPeriod = metav1.Duration{Duration: 0}
	c.Logging.Verbosity = 4
	return c
}

func (b *reloadBed) intervals() (minInterval, maxInterval time.Duration) {
	r := b.s.Proxy.runner
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.minInterval, r.maxInterval
}

// TestReloadRefusedKeepsEverything: a configuration a dataplane refuses leaves all of the running one in
// force: the dataplanes' (the IPv4 one, which took it, gets the running one back), the sync periods, the
// log verbosity and what /configz shows.
func TestReloadRefusedKeepsEverything(t *testing.T) {
	b := newReloadBed(t)
	cur := b.s.Config()
	min0, max0 := b.intervals()
	b.dp6.refuse = errors.New("ipvs.scheduler mh is not usable")
	res := b.reload(t, changed())
	if res.Result != "invalid" || !strings.Contains(res.Message, "not usable") {
		t.Fatalf("Reload = %+v, want invalid naming the refusal", res)
	}
	if b.s.Config() != cur {
		t.Error("the refused configuration is in force")
	}
	if minI, maxI := b.intervals(); minI != min0 || maxI != max0 {
		t.Errorf("sync intervals %v/%v after the refusal, want the running %v/%v", minI, maxI, min0, max0)
	}
	if n := len(b.verbosity); n == 0 || b.verbosity[n-1] != int(cur.Logging.Verbosity) {
		t.Errorf("verbosity calls %v: the running verbosity %d is not back", b.verbosity, cur.Logging.Verbosity)
	}
	if n := len(b.dp.accepted); n != 2 || b.dp.accepted[n-1] != cur {
		t.Errorf("the IPv4 dataplane took %d configurations, the last the running one: %v", n, n > 0 && b.dp.accepted[n-1] == cur)
	}
}

// TestReloadSyncFailureIsStillApplied: when the dataplanes take a configuration but the sync that writes
// it fails, the reload is reported applied (it is in force and the sync is retried), with the failure in
// its message, not as an invalid configuration.
func TestReloadSyncFailureIsStillApplied(t *testing.T) {
	b := newReloadBed(t)
	b.dp.setFail(errors.New("iptables-restore: exit status 4"))
	next := changed()
	res := b.reload(t, next)
	if res.Result != "applied" || !strings.Contains(res.Message, "failed and is retried") ||
		!strings.Contains(res.Message, "exit status 4") {
		t.Fatalf("Reload = %+v, want applied with the sync failure in the message", res)
	}
	if b.s.Config() != next {
		t.Error("the accepted configuration is not the one in force")
	}
	if len(b.dp.accepted) != 1 || b.dp.accepted[0] != next {
		t.Errorf("the dataplane accepted %d configurations", len(b.dp.accepted))
	}
	if minI, maxI := b.intervals(); minI != 0 || maxI != 7*time.Second {
		t.Errorf("sync intervals %v/%v, want the new 0s/7s", minI, maxI)
	}
	// Once the kernel works again the retry applies it.
	b.dp.setFail(nil)
	eventually(t, "the retried sync", func() bool {
		calls := b.dp.snapshotCalls()
		return calls[len(calls)-1].err == nil
	})
}

// TestReloadDuringASync: a reload that arrives while a sync is running, before that sync has offered a
// configuration to the dataplanes, is taken by that sync; the reload still gets its outcome (here a
// refusal) and not that of the next sync.
func TestReloadDuringASync(t *testing.T) {
	var mu sync.Mutex
	var hold chan struct{} // when set, the next sync stops here until it is closed
	entered := make(chan struct{}, 1)
	syncFault = func() {
		mu.Lock()
		h := hold
		hold = nil
		mu.Unlock()
		if h != nil {
			entered <- struct{}{}
			<-h
		}
	}
	t.Cleanup(func() { syncFault = nil })
	b := newReloadBed(t)
	cur := b.s.Config()
	release := make(chan struct{})
	mu.Lock()
	hold = release
	mu.Unlock()
	go func() { _ = b.s.Proxy.SyncNow(context.Background(), false) }()
	<-entered // a sync is running and has not looked for a reloaded configuration yet
	b.dp6.refuse = errors.New("ipvs.scheduler mh is not usable")
	done := make(chan config.ReloadResult)
	go func() { done <- b.reload(t, changed()) }()
	eventually(t, "the reload to be pending", func() bool {
		b.s.Proxy.mu.Lock()
		defer b.s.Proxy.mu.Unlock()
		return b.s.Proxy.reload != nil
	})
	close(release)
	if res := <-done; res.Result != "invalid" || !strings.Contains(res.Message, "not usable") {
		t.Errorf("Reload = %+v, want invalid naming the refusal", res)
	}
	if b.s.Config() != cur {
		t.Error("the refused configuration is in force")
	}
	if failures := func() int { n, _, _ := b.s.Proxy.runner.FailureState(); return n }(); failures != 0 {
		t.Errorf("the refusal counted as %d failed syncs", failures)
	}
}

// TestStatusShowsFailingSyncs: the STATUS line says that syncs fail, since when, and why, on one line.
func TestStatusShowsFailingSyncs(t *testing.T) {
	b := newReloadBed(t)
	if st := b.s.Status(); strings.Contains(st, "failing") {
		t.Fatalf("STATUS while syncs succeed: %q", st)
	}
	b.dp.setFail(errors.New("iptables-restore: exit status 2\nline 7 failed"))
	if err := b.s.Proxy.SyncNow(context.Background(), true); err == nil {
		t.Fatal("the sync did not fail")
	}
	st := b.s.Status()
	if !strings.Contains(st, "sync failing (1 in a row since ") || !strings.Contains(st, "exit status 2 line 7 failed") || strings.Contains(st, "\n") {
		t.Errorf("STATUS after a failed sync: %q", st)
	}
}

// TestServerRetriesABusyPort: a health or metrics port still held (by the proxy this one replaces, say)
// is tried again until it is free, unless bindAddressHardFail is set, which makes Run fail at once.
func TestServerRetriesABusyPort(t *testing.T) {
	for _, hardFail := range []bool{false, true} {
		t.Run(fmt.Sprintf("bindAddressHardFail=%v", hardFail), func(t *testing.T) {
			busy, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer busy.Close()
			cfg := config.Default()
			cfg.HealthzBindAddress = busy.Addr().String()
			cfg.MetricsBindAddress = "127.0.0.1:0"
			cfg.BindAddressHardFail = hardFail
			s := NewServer(cfg, apitest.New(fake.NewClientset()), thisNode, prometheus.NewRegistry(),
				[]FamilyDataplane{{Family: v1.IPv4Protocol, Dataplane: newFakeDataplane()}})
			s.listenRetry = 20 * time.Millisecond
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- s.Run(ctx) }()
			defer func() { cancel(); <-done }()
			if hardFail {
				select {
				case err := <-done:
					done <- err
					if err == nil || !strings.Contains(err.Error(), "healthz server") {
						t.Errorf("Run = %v, want the healthz listen error", err)
					}
				case <-time.After(10 * time.Second):
					t.Error("with bindAddressHardFail, Run did not fail on a busy port")
				}
				return
			}
			time.Sleep(100 * time.Millisecond) // a few failed tries
			busy.Close()
			eventually(t, "/healthz to answer once the port is free", func() bool {
				resp, err := http.Get("http://" + cfg.HealthzBindAddress + "/healthz")
				if err != nil {
					return false
				}
				resp.Body.Close()
				return true
			})
			select {
			case err := <-done:
				t.Errorf("Run returned %v on a busy port without bindAddressHardFail", err)
				done <- err
			default:
			}
		})
	}
}

// TestReloadLoadsAndSetsLogging: Reload reads the configuration through Reloading.Load and puts the live
// logging fields in force only when the reload is applied; a load error or a restart-only change keeps
// the running configuration and leaves the logging alone; the load's warnings, and a logging setting
// that could not be applied, are in an applied reload's message.
func TestReloadLoadsAndSetsLogging(t *testing.T) {
	b := newReloadBed(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cur := b.s.Config()

	res := b.reloadLoaded(ctx, nil, nil, errors.New("kube-proxy-config.yaml:3: mode: unknown"))
	if res.Result != config.ReloadInvalid || !strings.Contains(res.Message, "mode: unknown") {
		t.Errorf("a load error: Reload = %+v, want invalid naming it", res)
	}
	restart := changed()
	restart.HostnameOverride = "elsewhere"
	if res := b.reloadLoaded(ctx, restart, nil, nil); res.Result != config.ReloadRestartRequired {
		t.Errorf("a restart-only change: Reload = %+v, want restart-required", res)
	}
	if b.s.Config() != cur || len(b.applied) != 0 || len(b.verbosity) != 0 {
		t.Fatalf("refused reloads changed something: config kept %v, logging applied %d times, verbosity set %v",
			b.s.Config() == cur, len(b.applied), b.verbosity)
	}

	next := changed()
	next.Logging.FlushFrequency.Duration.Duration = 3 * time.Second
	b.applyErr = errors.New("vmodule: bad pattern")
	warn := &config.FieldError{Field: "featureGates.SomeGate", Msg: "is GA and always on"}
	res = b.reloadLoaded(ctx, next, []*config.FieldError{warn}, nil)
	if res.Result != config.ReloadApplied || b.s.Config() != next {
		t.Fatalf("Reload = %+v, want applied with next in force", res)
	}
	for _, want := range []string{"except the logging settings: vmodule: bad pattern", "warnings: " + warn.Error()} {
		if !strings.Contains(res.Message, want) {
			t.Errorf("message %q lacks %q", res.Message, want)
		}
	}
	if len(b.applied) != 1 || b.applied[0].FlushFrequency.Duration.Duration != 3*time.Second {
		t.Errorf("logging applied %+v, want next's once", b.applied)
	}
	if len(b.verbosity) != 1 || b.verbosity[0] != int(next.Logging.Verbosity) {
		t.Errorf("verbosity calls %v, want next's %d", b.verbosity, next.Logging.Verbosity)
	}
}
