package proxy

import (
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// ProblemSink is told about every unusable object or field the proxy skips; kind is "Service",
// "EndpointSlice" or "Node". It backs a counter, so it must be cheap.
type ProblemSink func(kind string)

// problemReporter logs skipped objects at most once per object and problem per window, and at most burst
// lines per second overall, so a broken controller rewriting a bad object cannot flood the journal.
type problemReporter struct {
	sink   ProblemSink
	window time.Duration
	burst  int
	now    func() time.Time

	mu       sync.Mutex
	lastSeen map[string]time.Time
	second   time.Time
	inSecond int
}

func newProblemReporter(sink ProblemSink) *problemReporter {
	if sink == nil {
		sink = func(string) {}
	}
	return &problemReporter{sink: sink, window: 5 * time.Minute, burst: 10, now: time.Now, lastSeen: map[string]time.Time{}}
}

// skip counts a skipped object or field and logs it unless it was logged recently.
func (r *problemReporter) skip(kind, object, problem string) {
	r.sink(kind)
	if r.shouldLog(kind + " " + object + " " + problem) {
		klog.ErrorS(nil, "Skipping unusable API object field", "kind", kind, "object", object, "problem", problem)
	}
}

// note logs, at -v=2 and rate-limited like skip, an object that is set aside for now without being wrong;
// it is not counted.
func (r *problemReporter) note(kind, object, what string) {
	if klog.V(2).Enabled() && r.shouldLog(kind+" "+object+" "+what) {
		klog.V(2).InfoS("Setting aside an API object for now", "kind", kind, "object", object, "reason", what)
	}
}

func (r *problemReporter) shouldLog(key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	if t, ok := r.lastSeen[key]; ok && now.Sub(t) < r.window {
		return false
	}
	if now.Sub(r.second) >= time.Second {
		r.second, r.inSecond = now, 0
	}
	if r.inSecond >= r.burst {
		return false
	}
	r.inSecond++
	if len(r.lastSeen) > 10000 {
		for k, t := range r.lastSeen {
			if now.Sub(t) >= r.window {
				delete(r.lastSeen, k)
			}
		}
	}
	r.lastSeen[key] = now
	return true
}
