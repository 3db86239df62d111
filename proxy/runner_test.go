package proxy

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncRecorder is a SyncFunc that records each run's full flag, can hold a run until released, and returns
// a chosen error or panics.
type syncRecorder struct {
	mu    sync.Mutex
	calls []bool
	// gates[i] holds run i (from 0) until closed.
	gates map[int]chan struct{}
	// results[i] is what run i returns; panics[i] makes it panic instead.
	results map[int]error
	panics  map[int]bool
	started chan int
}

func newSyncRecorder() *syncRecorder {
	return &syncRecorder{gates: map[int]chan struct{}{}, results: map[int]error{}, panics: map[int]bool{},
		started: make(chan int, 10000)}
}

// hold makes run i wait until the returned function is called.
func (s *syncRecorder) hold(i int) (release func()) {
	ch := make(chan struct{})
	s.mu.Lock()
	s.gates[i] = ch
	s.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { close(ch) }) }
}

func (s *syncRecorder) fail(i int, err error) {
	s.mu.Lock()
	s.results[i] = err
	s.mu.Unlock()
}

func (s *syncRecorder) panicAt(i int) {
	s.mu.Lock()
	s.panics[i] = true
	s.mu.Unlock()
}

func (s *syncRecorder) fn(ctx context.Context, full bool) error {
	s.mu.Lock()
	i := len(s.calls)
	s.calls = append(s.calls, full)
	gate, err, p := s.gates[i], s.results[i], s.panics[i]
	s.mu.Unlock()
	select {
	case s.started <- i:
	default: // a runaway runner must not block here; the test fails on its counts instead
	}
	if gate != nil {
		<-gate
	}
	if p {
		panic("boom")
	}
	return err
}

func (s *syncRecorder) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.calls)
}

func (s *syncRecorder) full(i int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[i]
}

// waitStart waits for run i to start.
func (s *syncRecorder) waitStart(t *testing.T, i int) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case j := <-s.started:
			if j == i {
				return
			}
			if j > i {
				t.Fatalf("waiting for run %d, but run %d started", i, j)
			}
		case <-timeout:
			t.Fatalf("run %d never started (%d runs so far)", i, s.count())
		}
	}
}

// startRunner runs r.Loop until the test ends.
func startRunner(t *testing.T, r *Runner) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Loop(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

func syncNow(t *testing.T, r *Runner, full bool) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := r.SyncNow(ctx, full)
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("SyncNow never returned")
	}
	return err
}

func waiters(r *Runner) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.waiters)
}

// TestRunnerNext checks the scheduling decision on its own, with a fixed clock.
func TestRunnerNext(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	end := now.Add(-time.Millisecond)
	tests := []struct {
		name      string
		lastEnd   time.Time
		lastFull  time.Time // zero: the last run was full
		failures  int
		requested bool
		full      bool
		min, max  time.Duration
		wantDue   time.Time
		wantFull  bool
	}{
		{name: "first run: now, full", min: time.Second, max: time.Hour, wantDue: now, wantFull: true},
		{name: "idle: full at maxInterval", lastEnd: end, min: time.Second, max: time.Hour, wantDue: end.Add(time.Hour), wantFull: true},
		{name: "partial request: at minInterval", lastEnd: end, requested: true, min: time.Second, max: time.Hour,
			wantDue: end.Add(time.Second), wantFull: false},
		{name: "full request: at minInterval", lastEnd: end, requested: true, full: true, min: time.Second, max: time.Hour,
			wantDue: end.Add(time.Second), wantFull: true},
		{name: "zero minInterval: right after the last run", lastEnd: end, requested: true, max: time.Hour,
			wantDue: end, wantFull: false},
		{name: "one failure: backoff 1s floor, full despite a partial request", lastEnd: end, failures: 1, requested: true,
			min: 100 * time.Millisecond, max: time.Hour, wantDue: end.Add(time.Second), wantFull: true},
		{name: "one failure: minInterval above the floor", lastEnd: end, failures: 1, min: 2 * time.Second, max: time.Hour,
			wantDue: end.Add(2 * time.Second), wantFull: true},
		{name: "three failures: doubling", lastEnd: end, failures: 3, min: time.Second, max: time.Hour,
			wantDue: end.Add(4 * time.Second), wantFull: true},
		{name: "many failures: capped at maxInterval", lastEnd: end, failures: 40, min: time.Second, max: 30 * time.Second,
			wantDue: end.Add(30 * time.Second), wantFull: true},
		{name: "failure with a short maxInterval: capped", lastEnd: end, failures: 1, max: 10 * time.Millisecond,
			wantDue: end.Add(10 * time.Millisecond), wantFull: true},
		{name: "steady churn: the periodic full sync counts from the last full one", lastEnd: end,
			lastFull: end.Add(-time.Hour + 500*time.Millisecond), requested: true, min: time.Second, max: time.Hour,
			wantDue: end.Add(500 * time.Millisecond), wantFull: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := NewRunner(nil, tc.min, tc.max)
			r.now = func() time.Time { return now }
			r.lastEnd, r.failures, r.requested, r.full = tc.lastEnd, tc.failures, tc.requested, tc.full
			r.lastFullEnd = tc.lastEnd
			if !tc.lastFull.IsZero() {
				r.lastFullEnd = tc.lastFull
			}
			due, full := r.next()
			if !due.Equal(tc.wantDue) || full != tc.wantFull {
				t.Errorf("next() = %v (+%v), %v; want %v (+%v), %v", due, due.Sub(end), full, tc.wantDue, tc.wantDue.Sub(end), tc.wantFull)
			}
		})
	}
}

func TestRunnerSetIntervalsClamps(t *testing.T) {
	r := NewRunner(nil, time.Hour, time.Minute)
	if r.minInterval != time.Minute || r.maxInterval != time.Minute {
		t.Errorf("min > max: got %v, %v; want both 1m", r.minInterval, r.maxInterval)
	}
	r.SetIntervals(time.Second, 0)
	if r.minInterval != time.Second || r.maxInterval != 30*time.Second {
		t.Errorf("zero max: got %v, %v; want 1s, 30s", r.minInterval, r.maxInterval)
	}
}

func TestRunnerFirstRunIsFullAndImmediate(t *testing.T) {
	rec := newSyncRecorder()
	// Both intervals are an hour: only "the first run is immediate" can make it run.
	r := NewRunner(rec.fn, time.Hour, time.Hour)
	startRunner(t, r)
	rec.waitStart(t, 0)
	if !rec.full(0) {
		t.Errorf("first run was partial")
	}
}

func TestRunnerCoalescesRequests(t *testing.T) {
	rec := newSyncRecorder()
	r := NewRunner(rec.fn, 0, time.Hour)
	release := rec.hold(1)
	startRunner(t, r)
	rec.waitStart(t, 0)
	r.Request(false)
	rec.waitStart(t, 1)

	// Many requests from several goroutines while run 1 is in progress...
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				r.Request(false)
			}
		}()
	}
	wg.Wait()
	release()
	// ...become exactly one more run, partial.
	rec.waitStart(t, 2)
	if rec.full(2) {
		t.Errorf("coalesced run was full; only partial syncs were requested")
	}
	// A SyncNow afterwards is the next run: nothing ran in between.
	if err := syncNow(t, r, false); err != nil {
		t.Fatal(err)
	}
	if n := rec.count(); n != 4 {
		t.Errorf("%d runs, want 4 (initial, held, coalesced, SyncNow)", n)
	}
}

func TestRunnerFullFlag(t *testing.T) {
	rec := newSyncRecorder()
	r := NewRunner(rec.fn, 0, time.Hour)
	release := rec.hold(1)
	startRunner(t, r)
	rec.waitStart(t, 0)
	r.Request(false)
	rec.waitStart(t, 1)
	if rec.full(1) {
		t.Errorf("run 1: partial requested, got full")
	}
	r.Request(false)
	r.Request(true)
	r.Request(false)
	release()
	rec.waitStart(t, 2)
	if !rec.full(2) {
		t.Errorf("run 2: a full request among partial ones must make it full")
	}
	if err := syncNow(t, r, false); err != nil {
		t.Fatal(err)
	}
	if rec.full(3) {
		t.Errorf("run 3: the full flag leaked from the previous run")
	}
	if err := syncNow(t, r, true); err != nil {
		t.Fatal(err)
	}
	if !rec.full(4) {
		t.Errorf("run 4: SyncNow(full) ran partial")
	}
}

func TestRunnerPeriodicFullRuns(t *testing.T) {
	rec := newSyncRecorder()
	r := NewRunner(rec.fn, 0, 2*time.Millisecond)
	startRunner(t, r)
	for i := 0; i < 5; i++ {
		rec.waitStart(t, i)
		if !rec.full(i) {
			t.Errorf("periodic run %d was partial", i)
		}
	}
}

func TestRunnerSetIntervalsWhileRunning(t *testing.T) {
	rec := newSyncRecorder()
	r := NewRunner(rec.fn, 0, time.Hour)
	startRunner(t, r)
	rec.waitStart(t, 0)
	// The loop now waits an hour; new intervals must take effect without a request.
	r.SetIntervals(0, 2*time.Millisecond)
	for i := 1; i <= 3; i++ {
		rec.waitStart(t, i)
	}
}

func TestRunnerRetryAfterFailureIsFull(t *testing.T) {
	rec := newSyncRecorder()
	r := NewRunner(rec.fn, 0, time.Hour)
	boom := errors.New("kernel says no")
	rec.fail(1, boom)
	release := rec.hold(2)
	startRunner(t, r)
	rec.waitStart(t, 0)
	if err := syncNow(t, r, false); !errors.Is(err, boom) {
		t.Fatalf("SyncNow = %v, want the sync's error", err)
	}
	if rec.full(1) {
		t.Fatalf("run 1 should have been partial")
	}
	// Nobody asks again: the retry comes by itself (after the backoff), as a full sync.
	rec.waitStart(t, 2)
	if !rec.full(2) {
		t.Errorf("retry after a failure was partial")
	}
	if f, _, _ := r.FailureState(); f != 1 {
		t.Errorf("FailureState() during the retry = %d, want 1", f)
	}
	if d := r.RunningFor(); d < 0 {
		t.Errorf("RunningFor() = %v during a run", d)
	}
	release()
	if err := syncNow(t, r, false); err != nil {
		t.Fatal(err)
	}
	if f, _, _ := r.FailureState(); f != 0 {
		t.Errorf("FailureState() after success = %d, want 0", f)
	}
	if d := r.RunningFor(); d != 0 {
		t.Errorf("RunningFor() when idle = %v, want 0", d)
	}
}

func TestRunnerSyncNowWaitsForALaterRun(t *testing.T) {
	rec := newSyncRecorder()
	r := NewRunner(rec.fn, 0, time.Hour)
	release := rec.hold(1)
	startRunner(t, r)
	rec.waitStart(t, 0)
	r.Request(false)
	rec.waitStart(t, 1) // run 1 is in progress

	result := make(chan int, 1)
	go func() {
		_ = r.SyncNow(context.Background(), false)
		result <- rec.count()
	}()
	eventually(t, "SyncNow to register", func() bool { return waiters(r) == 1 })
	release()
	select {
	case n := <-result:
		if n < 3 {
			t.Errorf("SyncNow returned after %d runs: it took the result of a run that started before it", n)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("SyncNow never returned")
	}
}

func TestRunnerPanicBecomesError(t *testing.T) {
	rec := newSyncRecorder()
	r := NewRunner(rec.fn, 0, time.Hour)
	rec.panicAt(1)
	startRunner(t, r)
	rec.waitStart(t, 0)
	err := syncNow(t, r, false)
	if err == nil || !strings.Contains(err.Error(), "panicked") || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("SyncNow = %v, want an error naming the panic", err)
	}
	// The loop survives, and the retry is full.
	if err := syncNow(t, r, false); err != nil {
		t.Fatalf("after a panic: %v", err)
	}
	if !rec.full(2) {
		t.Errorf("run after the panic was partial")
	}
}

func TestRunnerStopReleasesWaiters(t *testing.T) {
	rec := newSyncRecorder()
	r := NewRunner(rec.fn, 0, time.Hour)
	release := rec.hold(1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Loop(ctx); close(done) }()
	defer func() { cancel(); release(); <-done }()
	rec.waitStart(t, 0)
	r.Request(false)
	rec.waitStart(t, 1)

	result := make(chan error, 1)
	go func() { result <- r.SyncNow(context.Background(), false) }()
	eventually(t, "SyncNow to register", func() bool { return waiters(r) == 1 })
	cancel()
	release()
	select {
	case err := <-result:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("SyncNow after the loop stopped = %v, want context.Canceled", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("SyncNow never returned after the loop stopped")
	}
	<-done
	if n := rec.count(); n != 2 {
		t.Errorf("%d runs, want 2: no run may start after the context is done", n)
	}
}
