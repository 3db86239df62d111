package syncstate

import (
	"errors"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"

	"kube-proxy/proxy"
)

func snapshot(gen uint64) *proxy.Snapshot { return &proxy.Snapshot{Generation: gen} }

// syncOK runs one successful sync of snap and returns what it began with.
func syncOK(st *State, snap *proxy.Snapshot) Sync {
	s := st.Begin()
	st.Succeeded(s, snap)
	return s
}

func TestFirstSyncIsFull(t *testing.T) {
	var st State
	if st.Synced() {
		t.Error("Synced before any sync")
	}
	s := st.Begin()
	if !s.Full || s.Last != nil {
		t.Fatalf("first Begin = %+v, want Full and no Last", s)
	}
	if st.Synced() {
		t.Error("Synced during the first sync")
	}
	a := snapshot(1)
	if !st.Succeeded(s, a) {
		t.Error("Succeeded reports a reconfiguration that did not happen")
	}
	if !st.Synced() || st.Last() != a {
		t.Errorf("after success: Synced %v, Last %p, want true, %p", st.Synced(), st.Last(), a)
	}
	s = st.Begin()
	if s.Full || s.Last != a {
		t.Fatalf("second Begin = %+v, want partial from the first snapshot", s)
	}
	if st.Synced() {
		t.Error("Synced while a sync is under way")
	}
}

func TestFailureMakesNextFull(t *testing.T) {
	var st State
	a := snapshot(1)
	syncOK(&st, a)
	st.Begin() // fails: no Succeeded
	if st.Synced() {
		t.Error("Synced after a failed sync")
	}
	s := st.Begin()
	if !s.Full || s.Last != a {
		t.Fatalf("Begin after a failure = %+v, want Full, Last the last applied", s)
	}
	b := snapshot(2)
	st.Succeeded(s, b)
	if s := st.Begin(); s.Full || s.Last != b {
		t.Fatalf("Begin after recovering = %+v, want partial from b", s)
	}
}

func TestReconfigured(t *testing.T) {
	var st State
	syncOK(&st, snapshot(1))
	before := st.Begin()
	st.Succeeded(before, snapshot(2))
	st.Reconfigured()
	if st.Current(before) {
		t.Error("a sync begun before Reconfigured is Current")
	}
	if st.Synced() {
		t.Error("Synced after Reconfigured")
	}
	s := st.Begin()
	if !s.Full || !st.Current(s) {
		t.Fatalf("Begin after Reconfigured = %+v (current %v), want Full and current", s, st.Current(s))
	}
	if !st.Succeeded(s, snapshot(3)) {
		t.Error("Succeeded after Reconfigured-before-Begin reports not current")
	}
	if s := st.Begin(); s.Full {
		t.Error("the sync after the reconfigured one is still full")
	}
}

// A sync that read the configuration before a reload must not clear the need for a full sync: what it
// wrote is the old configuration's.
func TestReconfiguredDuringSync(t *testing.T) {
	var st State
	syncOK(&st, snapshot(1))
	s := st.Begin()
	st.Reconfigured()
	b := snapshot(2)
	if st.Succeeded(s, b) {
		t.Error("Succeeded reports the configuration current after Reconfigured during the sync")
	}
	if st.Synced() {
		t.Error("Synced after a sync that was reconfigured under it")
	}
	next := st.Begin()
	if !next.Full || next.Last != b {
		t.Fatalf("Begin after = %+v, want Full, Last the snapshot the sync applied", next)
	}
	st.Succeeded(next, snapshot(3))
	if !st.Synced() {
		t.Error("not Synced after the full sync that followed")
	}
}

func TestReconfiguredPartial(t *testing.T) {
	var st State
	syncOK(&st, snapshot(1))
	old := st.Begin()
	st.Succeeded(old, snapshot(2))
	st.ReconfiguredPartial()
	if st.Current(old) {
		t.Error("a sync begun before ReconfiguredPartial is Current")
	}
	if !st.Synced() {
		t.Error("ReconfiguredPartial between syncs asked for a full sync")
	}
	s := st.Begin()
	if s.Full {
		t.Fatal("Begin after ReconfiguredPartial is full")
	}
	st.ReconfiguredPartial() // during the sync
	if st.Succeeded(s, snapshot(3)) {
		t.Error("Succeeded reports current after ReconfiguredPartial during the sync")
	}
	if s := st.Begin(); !s.Full {
		t.Error("ReconfiguredPartial during a sync left the next one partial")
	}
}

func TestMarkFull(t *testing.T) {
	var st State
	syncOK(&st, snapshot(1))
	st.MarkFull()
	if st.Synced() {
		t.Error("Synced after MarkFull")
	}
	s := st.Begin()
	if !s.Full {
		t.Fatal("Begin after MarkFull is not full")
	}
	st.MarkFull() // during the sync: found removed after the sync read the kernel, say
	if !st.Succeeded(s, snapshot(2)) {
		t.Error("MarkFull made the configuration not current")
	}
	if s := st.Begin(); !s.Full {
		t.Error("MarkFull during a sync was cleared by its success")
	}
}

// TestConcurrent reconfigures while syncs run (for -race), and checks that once both are done and one
// sync began after the last reconfiguration, nothing is left to do.
func TestConcurrent(t *testing.T) {
	var st State
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for i := range 1000 {
			s := st.Begin()
			_ = st.Current(s)
			_ = st.Synced()
			st.Succeeded(s, snapshot(uint64(i)))
		}
	}()
	go func() {
		defer wg.Done()
		for i := range 1000 {
			switch i % 3 {
			case 0:
				st.Reconfigured()
			case 1:
				st.ReconfiguredPartial()
			default:
				st.MarkFull()
			}
		}
	}()
	wg.Wait()
	syncOK(&st, snapshot(1000))
	if !st.Synced() {
		t.Error("not Synced after a sync that began after every reconfiguration")
	}
}

type fakeCleaner struct {
	calls int
	err   error
}

func (c *fakeCleaner) Clean(*proxy.Snapshot) error { c.calls++; return c.err }

func TestCleanConntrack(t *testing.T) {
	name := func(p v1.Protocol) proxy.ServicePortName {
		n := proxy.ServicePortName{Protocol: p}
		n.Namespace, n.Name = "ns", "svc"
		return n
	}
	tcp, udp, sctp := name(v1.ProtocolTCP), name(v1.ProtocolUDP), name(v1.ProtocolSCTP)
	for _, tc := range []struct {
		name    string
		full    bool
		changed []proxy.ServicePortName
		want    int
	}{
		{"full, nothing changed", true, nil, 1},
		{"partial, nothing changed", false, nil, 0},
		{"partial, TCP changed", false, []proxy.ServicePortName{tcp}, 0},
		{"partial, UDP changed", false, []proxy.ServicePortName{tcp, udp}, 1},
		{"partial, SCTP changed", false, []proxy.ServicePortName{sctp}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &fakeCleaner{}
			CleanConntrack(c, v1.IPv4Protocol, snapshot(1), tc.full, tc.changed)
			if c.calls != tc.want {
				t.Errorf("Clean called %d times, want %d", c.calls, tc.want)
			}
		})
	}
	t.Run("nil cleaner", func(t *testing.T) {
		CleanConntrack(nil, v1.IPv4Protocol, snapshot(1), true, []proxy.ServicePortName{udp})
	})
	t.Run("failure is only logged", func(t *testing.T) {
		c := &fakeCleaner{err: errors.New("boom")}
		CleanConntrack(c, v1.IPv6Protocol, snapshot(1), true, nil)
		if c.calls != 1 {
			t.Errorf("Clean called %d times, want 1", c.calls)
		}
	})
}

func TestChangedExternally(t *testing.T) {
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "changed_total"})
	ChangedExternally(c, v1.IPv4Protocol, "iptables rules", "nat/KUBE-SERVICES is missing")
	ChangedExternally(c, v1.IPv4Protocol, "iptables rules", "nat/KUBE-SERVICES is missing")
	if got := testutil.ToFloat64(c); got != 2 {
		t.Errorf("counted %v, want 2", got)
	}
}
