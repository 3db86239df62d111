package proxy

import (
	"testing"
	"time"
)

func TestProblemReporterRateLimits(t *testing.T) {
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var counted []string
	r := newProblemReporter(func(kind string) { counted = append(counted, kind) })
	r.now = func() time.Time { return clock }

	steps := []struct {
		name    string
		key     string
		advance time.Duration
		want    bool
	}{
		{"first report of a problem is logged", "a", 0, true},
		{"the same problem again is not", "a", time.Second, false},
		{"nor within the window", "a", 4 * time.Minute, false},
		{"after the window it is logged again", "a", time.Minute, true},
		{"another problem is logged", "b", 0, true},
	}
	for _, st := range steps {
		clock = clock.Add(st.advance)
		if got := r.shouldLog(st.key); got != st.want {
			t.Errorf("%s: shouldLog = %v, want %v", st.name, got, st.want)
		}
	}

	// At most burst distinct lines per second.
	clock = clock.Add(time.Hour)
	logged := 0
	for i := 0; i < 3*r.burst; i++ {
		if r.shouldLog(string(rune('A' + i))) {
			logged++
		}
	}
	if logged != r.burst {
		t.Errorf("%d lines logged in one second, want %d", logged, r.burst)
	}
	clock = clock.Add(time.Second)
	if !r.shouldLog("late") {
		t.Errorf("a new second does not allow new lines")
	}

	// Every skip is counted, logged or not.
	for i := 0; i < 5; i++ {
		r.skip("Service", "ns/a", "same problem")
	}
	if len(counted) != 5 {
		t.Errorf("sink called %d times, want 5", len(counted))
	}
}
