package proxy

import (
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
)

// TaintToBeDeletedByClusterAutoscaler marks a node the autoscaler is about to remove; /healthz then fails so
// load balancers drain it first.
const TaintToBeDeletedByClusterAutoscaler = "ToBeDeletedByClusterAutoscaler"

// Health tracks whether queued changes reach the kernel in time, per IP family, and serves upstream's
// /healthz and /livez. A family is unhealthy when a change has been queued for longer than the timeout
// without a successful sync. /healthz additionally fails when this node is unknown, being deleted, or tainted
// for deletion; /livez ignores the node.
type Health struct {
	timeout time.Duration
	now     func() time.Time
	node    func() *v1.Node
	metrics *Metrics

	mu          sync.Mutex
	lastUpdated map[v1.IPFamily]time.Time
	oldestQueue map[v1.IPFamily]time.Time
}

// NewHealth returns a Health with the given timeout (upstream uses twice the sync period). node returns the
// current Node object (nil when unknown).
func NewHealth(timeout time.Duration, node func() *v1.Node, m *Metrics) *Health {
	return &Health{timeout: timeout, now: time.Now, node: node, metrics: m,
		lastUpdated: map[v1.IPFamily]time.Time{}, oldestQueue: map[v1.IPFamily]time.Time{}}
}

// SetTimeout changes the timeout (on a reload of the sync period).
func (h *Health) SetTimeout(d time.Duration) {
	h.mu.Lock()
	h.timeout = d
	h.mu.Unlock()
}

// Queued records that a change is waiting to be applied for family.
func (h *Health) Queued(family v1.IPFamily) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.oldestQueue[family]; !ok {
		h.oldestQueue[family] = h.now()
	}
}

// Updated records a successful sync of family.
func (h *Health) Updated(family v1.IPFamily) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.oldestQueue, family)
	h.lastUpdated[family] = h.now()
}

// FamilyHealth is one family's state in the JSON answer.
type FamilyHealth struct {
	LastUpdated time.Time `json:"lastUpdated"`
	Healthy     bool      `json:"healthy"`
}

// Status is the JSON body of /healthz and /livez (upstream's fields).
type Status struct {
	LastUpdated  time.Time                    `json:"lastUpdated"`
	CurrentTime  time.Time                    `json:"currentTime"`
	NodeEligible *bool                        `json:"nodeEligible,omitempty"`
	Healthy      bool                         `json:"healthy"`
	Status       map[v1.IPFamily]FamilyHealth `json:"status,omitempty"`
}

// Status returns the sync health (without the node check).
func (h *Health) Status() Status {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	st := Status{Healthy: true, CurrentTime: now, Status: map[v1.IPFamily]FamilyHealth{}}
	for f, t := range h.lastUpdated {
		if t.After(st.LastUpdated) {
			st.LastUpdated = t
		}
		healthy := true
		if q, ok := h.oldestQueue[f]; ok && now.Sub(q) >= h.timeout {
			healthy, st.Healthy = false, false
		}
		st.Status[f] = FamilyHealth{LastUpdated: t, Healthy: healthy}
	}
	return st
}

// NodeEligible reports whether this node should receive load-balancer traffic: it exists, is not being
// deleted and is not tainted for deletion by the cluster autoscaler.
func (h *Health) NodeEligible() bool {
	n := h.node()
	if n == nil || n.DeletionTimestamp != nil {
		return false
	}
	for _, t := range n.Spec.Taints {
		if t.Key == TaintToBeDeletedByClusterAutoscaler {
			return false
		}
	}
	return true
}

// Handler serves /healthz and /livez.
func (h *Health) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		st := h.Status()
		eligible := h.NodeEligible()
		st.NodeEligible = &eligible
		h.write(w, st, st.Healthy && eligible, h.metrics.HealthzTotal)
	})
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) {
		st := h.Status()
		h.write(w, st, st.Healthy, h.metrics.LivezTotal)
	})
	return mux
}

func (h *Health) write(w http.ResponseWriter, st Status, healthy bool, counter *prometheus.CounterVec) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	code := http.StatusOK
	if healthy {
		st.LastUpdated = st.CurrentTime
	} else {
		code = http.StatusServiceUnavailable
	}
	counter.WithLabelValues(strconv.Itoa(code)).Inc()
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(st)
}
