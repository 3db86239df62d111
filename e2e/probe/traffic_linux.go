package probe

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Target is one address Traffic connects to.
type Target struct{ Network, Addr string }

// Traffic keeps making new connections to its targets, round robin, until stopped, and keeps every
// result: a test proves that a change (a restart, a reload, a handover) loses no connection.
type Traffic struct {
	mu       sync.Mutex
	results  []HitResult
	stopping chan struct{}
	once     sync.Once
	done     chan struct{}
}

// StartTraffic starts connections with dial (nil: from this process's namespace) to the targets in a
// loop: each round makes 4 new connections to every target, 4 at a time, each with a 2 s timeout. Call
// Stop to end it.
func StartTraffic(dial Dialer, targets []Target) *Traffic {
	tr := &Traffic{stopping: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(tr.done)
		for {
			for _, tg := range targets {
				select {
				case <-tr.stopping:
					return
				default:
				}
				res, _ := HitWith(context.Background(), dial, tg.Network, tg.Addr, 4, HitOptions{Concurrency: 4, Timeout: 2 * time.Second})
				tr.mu.Lock()
				tr.results = append(tr.results, res...)
				tr.mu.Unlock()
			}
		}
	}()
	return tr
}

// Count returns how many connections have completed.
func (tr *Traffic) Count() int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return len(tr.results)
}

// WaitFor waits, checking every 100 ms, until at least n connections have completed; after timeout it
// gives up with an error saying how many did.
func (tr *Traffic) WaitFor(n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c := tr.Count()
		if c >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v waiting for %d connections: %d so far", timeout, n, c)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Stop ends the loop once the connections under way are done (2 s at most), so that every connection
// made is in the results, and returns them. It is idempotent.
func (tr *Traffic) Stop() []HitResult {
	tr.once.Do(func() { close(tr.stopping) })
	<-tr.done
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.results
}
