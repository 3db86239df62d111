package proxy

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestHealthHandlers walks /healthz and /livez through upstream's states with an injected clock.
func TestHealthHandlers(t *testing.T) {
	v4, v6 := v1.IPv4Protocol, v1.IPv6Protocol
	clock := time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
	node := makeNode(thisNode, "", []string{"InternalIP=192.168.0.1"})
	m := NewMetrics(prometheus.NewRegistry())
	h := NewHealth(10*time.Second, func() *v1.Node { return node }, m)
	h.now = func() time.Time { return clock }
	handler := h.Handler()

	var t0, t1, t2 time.Time // sync times, filled in as the steps run
	ok, bad := http.StatusOK, http.StatusServiceUnavailable
	steps := []struct {
		name string
		do   func()
		// healthz and livez codes; healthy is the sync health; lastUpdated the body's value when unhealthy
		// (when healthy, it is the current time); status the per-family states (nil: none).
		healthz, livez int
		healthy        bool
		eligible       bool
		lastUpdated    func() time.Time
		status         func() map[v1.IPFamily]FamilyHealth
	}{
		{
			name:    "never synced",
			do:      func() {},
			healthz: ok, livez: ok, healthy: true, eligible: true,
		},
		{
			name: "queued long ago but never synced: upstream only judges families that synced once",
			do: func() {
				h.Queued(v4)
				clock = clock.Add(time.Minute)
			},
			healthz: ok, livez: ok, healthy: true, eligible: true,
		},
		{
			name: "both families synced",
			do: func() {
				h.Updated(v4)
				h.Updated(v6)
				t0 = clock
			},
			healthz: ok, livez: ok, healthy: true, eligible: true,
			status: func() map[v1.IPFamily]FamilyHealth {
				return map[v1.IPFamily]FamilyHealth{v4: {t0, true}, v6: {t0, true}}
			},
		},
		{
			name:    "nothing queued for a long time stays healthy",
			do:      func() { clock = clock.Add(25 * time.Second) },
			healthz: ok, livez: ok, healthy: true, eligible: true,
			status: func() map[v1.IPFamily]FamilyHealth {
				return map[v1.IPFamily]FamilyHealth{v4: {t0, true}, v6: {t0, true}}
			},
		},
		{
			name: "IPv4 change queued within the timeout",
			do: func() {
				h.Queued(v4)
				clock = clock.Add(5 * time.Second)
			},
			healthz: ok, livez: ok, healthy: true, eligible: true,
			status: func() map[v1.IPFamily]FamilyHealth {
				return map[v1.IPFamily]FamilyHealth{v4: {t0, true}, v6: {t0, true}}
			},
		},
		{
			name: "IPv4 change queued beyond the timeout (the oldest queue time counts)",
			do: func() {
				h.Queued(v4) // a later change does not restart the clock
				clock = clock.Add(5 * time.Second)
			},
			healthz: bad, livez: bad, healthy: false, eligible: true,
			lastUpdated: func() time.Time { return t0 },
			status: func() map[v1.IPFamily]FamilyHealth {
				return map[v1.IPFamily]FamilyHealth{v4: {t0, false}, v6: {t0, true}}
			},
		},
		{
			name: "IPv6 synced meanwhile: still unhealthy, lastUpdated is the latest sync",
			do: func() {
				h.Updated(v6)
				t1 = clock
			},
			healthz: bad, livez: bad, healthy: false, eligible: true,
			lastUpdated: func() time.Time { return t1 },
			status: func() map[v1.IPFamily]FamilyHealth {
				return map[v1.IPFamily]FamilyHealth{v4: {t0, false}, v6: {t1, true}}
			},
		},
		{
			name: "IPv4 synced: healthy again",
			do: func() {
				h.Updated(v4)
				t2 = clock
			},
			healthz: ok, livez: ok, healthy: true, eligible: true,
			status: func() map[v1.IPFamily]FamilyHealth {
				return map[v1.IPFamily]FamilyHealth{v4: {t2, true}, v6: {t1, true}}
			},
		},
		{
			name:    "node unknown: healthz fails, livez does not",
			do:      func() { node = nil },
			healthz: bad, livez: ok, healthy: true, eligible: false,
			status: func() map[v1.IPFamily]FamilyHealth {
				return map[v1.IPFamily]FamilyHealth{v4: {t2, true}, v6: {t1, true}}
			},
		},
		{
			name: "node being deleted",
			do: func() {
				node = makeNode(thisNode, "", nil)
				node.DeletionTimestamp = &metav1.Time{Time: clock}
			},
			healthz: bad, livez: ok, healthy: true, eligible: false,
			status: func() map[v1.IPFamily]FamilyHealth {
				return map[v1.IPFamily]FamilyHealth{v4: {t2, true}, v6: {t1, true}}
			},
		},
		{
			name: "node tainted by the cluster autoscaler",
			do: func() {
				node = makeNode(thisNode, "", nil)
				node.Spec.Taints = []v1.Taint{{Key: "other", Effect: v1.TaintEffectNoSchedule},
					{Key: TaintToBeDeletedByClusterAutoscaler, Effect: v1.TaintEffectNoSchedule}}
			},
			healthz: bad, livez: ok, healthy: true, eligible: false,
			status: func() map[v1.IPFamily]FamilyHealth {
				return map[v1.IPFamily]FamilyHealth{v4: {t2, true}, v6: {t1, true}}
			},
		},
		{
			name: "node with another taint is eligible",
			do: func() {
				node = makeNode(thisNode, "", nil)
				node.Spec.Taints = []v1.Taint{{Key: "other", Effect: v1.TaintEffectNoSchedule}}
			},
			healthz: ok, livez: ok, healthy: true, eligible: true,
			status: func() map[v1.IPFamily]FamilyHealth {
				return map[v1.IPFamily]FamilyHealth{v4: {t2, true}, v6: {t1, true}}
			},
		},
		{
			name: "unhealthy and ineligible",
			do: func() {
				node = nil
				h.Queued(v6)
				clock = clock.Add(10 * time.Second) // exactly the timeout counts as late
			},
			healthz: bad, livez: bad, healthy: false, eligible: false,
			lastUpdated: func() time.Time { return t2 },
			status: func() map[v1.IPFamily]FamilyHealth {
				return map[v1.IPFamily]FamilyHealth{v4: {t2, true}, v6: {t1, false}}
			},
		},
	}

	counts := map[string]map[int]float64{"/healthz": {}, "/livez": {}}
	for _, st := range steps {
		st.do()
		for _, path := range []string{"/healthz", "/livez"} {
			want := st.livez
			if path == "/healthz" {
				want = st.healthz
			}
			rec := httptest.NewRecorder()
			handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
			counts[path][rec.Code]++
			if rec.Code != want {
				t.Errorf("%s: %s = %d, want %d", st.name, path, rec.Code, want)
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("%s: %s Content-Type %q", st.name, path, ct)
			}
			if v := rec.Header().Get("X-Content-Type-Options"); v != "nosniff" {
				t.Errorf("%s: %s X-Content-Type-Options %q", st.name, path, v)
			}
			var raw map[string]json.RawMessage
			if err := json.Unmarshal(rec.Body.Bytes(), &raw); err != nil {
				t.Fatalf("%s: %s body %q: %v", st.name, path, rec.Body.String(), err)
			}
			for _, k := range []string{"lastUpdated", "currentTime", "healthy"} {
				if _, ok := raw[k]; !ok {
					t.Errorf("%s: %s body lacks %q: %s", st.name, path, k, rec.Body.String())
				}
			}
			if _, has := raw["nodeEligible"]; has != (path == "/healthz") {
				t.Errorf("%s: %s nodeEligible present = %v", st.name, path, has)
			}
			var got Status
			if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
				t.Fatal(err)
			}
			if !got.CurrentTime.Equal(clock) {
				t.Errorf("%s: %s currentTime %v, want %v", st.name, path, got.CurrentTime, clock)
			}
			// Upstream reports the current time as lastUpdated while healthy.
			wantLast := clock
			if want != ok && st.lastUpdated != nil {
				wantLast = st.lastUpdated()
			}
			if want == ok || st.lastUpdated != nil {
				if !got.LastUpdated.Equal(wantLast) {
					t.Errorf("%s: %s lastUpdated %v, want %v", st.name, path, got.LastUpdated, wantLast)
				}
			}
			if got.Healthy != st.healthy {
				t.Errorf("%s: %s healthy %v, want %v", st.name, path, got.Healthy, st.healthy)
			}
			if path == "/healthz" && (got.NodeEligible == nil || *got.NodeEligible != st.eligible) {
				t.Errorf("%s: nodeEligible %v, want %v", st.name, got.NodeEligible, st.eligible)
			}
			var wantStatus map[v1.IPFamily]FamilyHealth
			if st.status != nil {
				wantStatus = st.status()
			}
			if diff := cmp.Diff(wantStatus, got.Status); diff != "" {
				t.Errorf("%s: %s status (-want +got):\n%s", st.name, path, diff)
			}
		}
	}
	for path, cv := range map[string]*prometheus.CounterVec{"/healthz": m.HealthzTotal, "/livez": m.LivezTotal} {
		for _, code := range []int{ok, bad} {
			label := map[int]string{ok: "200", bad: "503"}[code]
			if got := counterValue(t, cv.WithLabelValues(label)); got != counts[path][code] {
				t.Errorf("%s counter code=%s = %v, want %v", path, label, got, counts[path][code])
			}
		}
	}
}

func TestHealthSetTimeout(t *testing.T) {
	clock := time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
	h := NewHealth(time.Minute, func() *v1.Node { return nil }, NewMetrics(prometheus.NewRegistry()))
	h.now = func() time.Time { return clock }
	h.Updated(v1.IPv4Protocol)
	h.Queued(v1.IPv4Protocol)
	clock = clock.Add(30 * time.Second)
	if !h.Status().Healthy {
		t.Fatalf("30s into a 1m timeout: unhealthy")
	}
	h.SetTimeout(20 * time.Second)
	if h.Status().Healthy {
		t.Errorf("30s into a 20s timeout: healthy")
	}
}
