package proxy

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// SyncFunc performs one sync; full asks it to rewrite everything rather than only what changed.
type SyncFunc func(ctx context.Context, full bool) error

// Runner calls a SyncFunc from a single goroutine: soon after a request but never sooner than minInterval
// after the previous run ended, as a full sync at least every maxInterval after the previous full one, and
// after a failure again with exponential backoff (as a full sync) until it succeeds. Requests made while a
// run is in progress are coalesced into one more run.
type Runner struct {
	fn  SyncFunc
	now func() time.Time

	kick chan struct{}

	mu          sync.Mutex
	minInterval time.Duration
	maxInterval time.Duration
	requested   bool
	full        bool
	waiters     []chan error
	// state, for health and watchdog
	runningSince time.Time
	lastEnd      time.Time
	lastFullEnd  time.Time
	failures     int
	failingSince time.Time // end of the first of the current run of failures
	lastErr      error
}

// NewRunner returns a Runner for fn. Call Loop to start it.
func NewRunner(fn SyncFunc, minInterval, maxInterval time.Duration) *Runner {
	r := &Runner{fn: fn, now: time.Now, kick: make(chan struct{}, 1)}
	r.SetIntervals(minInterval, maxInterval)
	return r
}

// SetIntervals changes minInterval and maxInterval; it takes effect at the next scheduling decision.
func (r *Runner) SetIntervals(minInterval, maxInterval time.Duration) {
	if maxInterval <= 0 {
		maxInterval = 30 * time.Second
	}
	if minInterval > maxInterval {
		minInterval = maxInterval
	}
	r.mu.Lock()
	r.minInterval, r.maxInterval = minInterval, maxInterval
	r.mu.Unlock()
	r.poke()
}

// Request asks for a sync (a full one if full is set).
func (r *Runner) Request(full bool) {
	r.mu.Lock()
	r.requested = true
	r.full = r.full || full
	r.mu.Unlock()
	r.poke()
}

// SyncNow requests a sync and waits until a run that started after the request has finished, returning its
// error (or ctx's).
func (r *Runner) SyncNow(ctx context.Context, full bool) error {
	ch := make(chan error, 1)
	r.mu.Lock()
	r.requested = true
	r.full = r.full || full
	r.waiters = append(r.waiters, ch)
	r.mu.Unlock()
	r.poke()
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (r *Runner) poke() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// RunningFor returns how long the current run has been going (0 when idle).
func (r *Runner) RunningFor() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.runningSince.IsZero() {
		return 0
	}
	return r.now().Sub(r.runningSince)
}

// FailureState returns the number of consecutive failed runs, when the first of them ended and the last
// one's error (0, zero time and nil after a success).
func (r *Runner) FailureState() (n int, since time.Time, last error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failures, r.failingSince, r.lastErr
}

// next decides when the next run is due and whether it is full. Called with r.mu held.
func (r *Runner) next() (due time.Time, full bool) {
	if r.lastEnd.IsZero() {
		return r.now(), true // the first run is full and immediate
	}
	if r.failures > 0 {
		// Requests do not shorten the backoff: a failing kernel is not helped by being asked more often.
		backoff := max(r.minInterval, time.Second)
		for i := 1; i < r.failures && backoff < r.maxInterval; i++ {
			backoff *= 2
		}
		return r.lastEnd.Add(min(backoff, r.maxInterval)), true
	}
	// The periodic full sync counts from the last full one, so steady churn cannot postpone it forever.
	due, full = r.lastFullEnd.Add(r.maxInterval), true
	if r.requested {
		if d := r.lastEnd.Add(r.minInterval); d.Before(due) {
			due, full = d, r.full
		}
	}
	return due, full
}

// Loop runs syncs until ctx is cancelled. It must be called once.
func (r *Runner) Loop(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		r.mu.Lock()
		due, full := r.next()
		r.mu.Unlock()
		if wait := due.Sub(r.now()); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				r.finishWaiters(ctx.Err())
				return
			case <-r.kick:
				timer.Stop()
				continue
			case <-timer.C:
				continue // recompute: settings may have changed while waiting
			}
		}
		if ctx.Err() != nil {
			r.finishWaiters(ctx.Err())
			return
		}
		r.runOnce(ctx, full)
	}
}

func (r *Runner) runOnce(ctx context.Context, full bool) {
	r.mu.Lock()
	waiters := r.waiters
	r.waiters = nil
	r.requested, r.full = false, false
	r.runningSince = r.now()
	r.mu.Unlock()

	err := r.safeRun(ctx, full)

	r.mu.Lock()
	r.runningSince = time.Time{}
	r.lastEnd = r.now()
	if full && err == nil {
		r.lastFullEnd = r.lastEnd
	}
	if err != nil {
		if r.failures == 0 {
			r.failingSince = r.lastEnd
		}
		r.failures++
		r.lastErr = err
		klog.ErrorS(err, "Sync failed; will retry with a full sync", "consecutiveFailures", r.failures)
	} else {
		r.failures, r.failingSince, r.lastErr = 0, time.Time{}, nil
	}
	r.mu.Unlock()
	for _, w := range waiters {
		w <- err
	}
}

// safeRun turns a panic in a sync into an error, so one bad sync cannot take the daemon down.
func (r *Runner) safeRun(ctx context.Context, full bool) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("sync panicked: %v", p)
		}
	}()
	return r.fn(ctx, full)
}

func (r *Runner) finishWaiters(err error) {
	r.mu.Lock()
	waiters := r.waiters
	r.waiters = nil
	r.mu.Unlock()
	for _, w := range waiters {
		w <- err
	}
}
