package proxy

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
)

// stoppingDataplane is a dataplane with work to finish at stop: Stop blocks until release is closed or
// its context ends, and records when it returned and whether its context had a deadline.
type stoppingDataplane struct {
	*fakeDataplane
	release     chan struct{}
	stopped     chan struct{}
	hadDeadline bool
}

func (s *stoppingDataplane) Stop(ctx context.Context) {
	_, s.hadDeadline = ctx.Deadline()
	select {
	case <-s.release:
	case <-ctx.Done():
	}
	close(s.stopped)
}

// TestLoopStopsDataplanes: once its context ends, Loop gives the dataplanes that have work to finish the
// time to finish it (both families at once), and returns only after they have, or after stopTimeout.
func TestLoopStopsDataplanes(t *testing.T) {
	for _, tc := range []struct {
		name    string
		release bool // Stop's work ends by itself
	}{{"finishes", true}, {"cut at the deadline", false}} {
		t.Run(tc.name, func(t *testing.T) {
			old := stopTimeout
			stopTimeout = 200 * time.Millisecond
			t.Cleanup(func() { stopTimeout = old })
			v4 := &stoppingDataplane{fakeDataplane: newFakeDataplane(), release: make(chan struct{}), stopped: make(chan struct{})}
			v6 := &stoppingDataplane{fakeDataplane: newFakeDataplane(), release: make(chan struct{}), stopped: make(chan struct{})}
			p := New(Options{NodeName: thisNode, SyncPeriod: time.Hour, Registry: prometheus.NewRegistry(),
				Dataplanes: []FamilyDataplane{{Family: v1.IPv4Protocol, Dataplane: v4}, {Family: v1.IPv6Protocol, Dataplane: v6}}})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { p.Loop(ctx); close(done) }()
			cancel()
			for _, d := range []*stoppingDataplane{v4, v6} {
				select {
				case <-d.stopped:
					if tc.release {
						t.Fatal("Stop returned before its work was done")
					}
				case <-time.After(50 * time.Millisecond):
				}
			}
			select {
			case <-done:
				if tc.release {
					t.Fatal("Loop returned while the dataplanes were still stopping")
				}
			default:
			}
			if tc.release {
				close(v4.release)
				close(v6.release)
			}
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("Loop did not return")
			}
			for _, d := range []*stoppingDataplane{v4, v6} {
				select {
				case <-d.stopped:
				default:
					t.Fatal("Loop returned before a dataplane's Stop")
				}
				if !d.hadDeadline {
					t.Error("Stop was given a context without a deadline")
				}
			}
		})
	}
}
