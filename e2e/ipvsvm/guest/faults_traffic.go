//go:build linux

package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"kube-proxy/e2e/probe"
)

// result is one connection of the rows' traffic: "" or the error's class, with its text.
type result struct {
	err, detail string
	start, at   time.Time     // when it started and ended
	stalled     time.Duration // for a failed one, the longest stall of the guest while it lasted
}

// traffic makes new connections to the targets until stopped: 4 workers, each connection given 2 s
// (e2e/harness' StartTraffic, in the guest). Worker w connects to target w mod len(targets), from client
// namespace clientNS[w mod len(targets)]: each target from its own client address. From one address, the
// workers' concurrent connections to a cluster IP and a NodePort of the same pods now and then start at
// the same instant from the same port (a client picks its ports per destination), and the kernel's IPVS
// does not keep two such connections apart when they reach the same pod: one of them times out (the
// vip-port-reuse case; docs/DIFFERENCES.md). The rows measure the daemon, not that.
type traffic struct {
	mu       sync.Mutex
	res      []result
	stopping chan struct{}
	wg       sync.WaitGroup
	once     sync.Once
	stalls   *stallWatch
}

// clientNS are the client namespaces the targets are reached from, by target index (see traffic).
var clientNS = []string{"client", "client2"}

func startTraffic(targets []string) *traffic {
	if len(targets) > len(clientNS) {
		panic("more targets than client namespaces")
	}
	tr := &traffic{stopping: make(chan struct{}), stalls: watchStalls()}
	for w := 0; w < 4; w++ {
		tr.wg.Add(1)
		go func() {
			defer tr.wg.Done()
			target := targets[w%len(targets)]
			_ = inNS(clientNS[w%len(targets)], func() error {
				for {
					select {
					case <-tr.stopping:
						return nil
					default:
					}
					start := time.Now()
					err := tracedOnce(target, 2*time.Second)
					r := result{start: start, at: time.Now()}
					if err != nil {
						r.err, r.detail = errClass(err), err.Error()
					}
					tr.mu.Lock()
					tr.res = append(tr.res, r)
					tr.mu.Unlock()
				}
			})
		}()
	}
	return tr
}

func (tr *traffic) count() int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return len(tr.res)
}

// waitFor waits (a minute at most) until n connections were made.
func (tr *traffic) waitFor(n int) {
	_ = waitFor(time.Minute, func() error {
		if tr.count() >= n {
			return nil
		}
		return errors.New("not yet")
	})
}

// stop ends the traffic once the connections under way are done and returns every result; idempotent.
func (tr *traffic) stop() []result {
	tr.once.Do(func() {
		close(tr.stopping)
		tr.wg.Wait()
		gaps := tr.stalls.stop()
		var longest stall
		for _, g := range gaps {
			if g.d > longest.d {
				longest = g
			}
		}
		logf("traffic: %d connections, %d failed; the guest's CPUs stalled ≥ %v %d times, longest %v (CPU %d, ended %s)",
			len(tr.res), failures(tr.res), stallMin, len(gaps), longest.d.Round(time.Millisecond), longest.cpu, longest.end.Format("15:04:05.000"))
		listed := 0
		for i, r := range tr.res {
			if r.err != "" {
				tr.res[i].stalled = longestStall(gaps, r.start, r.at)
				if listed++; listed <= 20 {
					logf("traffic: failed %s–%s (guest stalled %v meanwhile): %s", r.start.Format("15:04:05.000"),
						r.at.Format("15:04:05.000"), tr.res[i].stalled.Round(time.Millisecond), r.detail)
				}
			}
		}
	})
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.res
}

// tracedOnce is once over TCP; when the answer does not come, its error names the IPVS connection entries
// of the connection (what the kernel had made of it, read before it is closed).
func tracedOnce(target string, timeout time.Duration) error {
	c, err := net.DialTimeout("tcp", target, timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, _, err := greet(c, "tcp", timeout); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return fmt.Errorf("%w (IPVS connection entries: %s)", err, ipvsConns(c.LocalAddr()))
		}
		return err
	}
	return nil
}

// ipvsConns returns the lines of the node's IPVS connection table (of PID 1's network namespace, the
// node's, whatever the caller's) whose client is local.
func ipvsConns(local net.Addr) string {
	a, ok := local.(*net.TCPAddr)
	if !ok || a.IP.To4() == nil {
		return "not an IPv4 TCP address"
	}
	ip := a.IP.To4()
	want := fmt.Sprintf("%02X%02X%02X%02X %04X ", ip[0], ip[1], ip[2], ip[3], a.Port)
	b, err := os.ReadFile("/proc/1/net/ip_vs_conn")
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, want) {
			out = append(out, strings.Join(strings.Fields(l), " "))
		}
	}
	if len(out) == 0 {
		return "none for " + local.String()
	}
	return strings.Join(out, " / ")
}

// stallWatch tells when the guest's CPUs did not run: a goroutine per CPU, its thread pinned there, sleeps
// stallTick at a time and records each wake-up later than stallMin. Under emulation each virtual CPU is a
// host thread, and when the host's own cores are busy it may not run for a while: a connection that lasted
// through such a stall lost that much of its time, whatever the dataplane did.
type stallWatch struct {
	mu   sync.Mutex
	gaps []stall
	done chan struct{}
	wg   sync.WaitGroup
}

// stall is a period in which a CPU's watching goroutine did not run, beyond its tick.
type stall struct {
	cpu int
	end time.Time
	d   time.Duration
}

const (
	stallTick = 10 * time.Millisecond
	stallMin  = 100 * time.Millisecond
)

func watchStalls() *stallWatch {
	w := &stallWatch{done: make(chan struct{})}
	for cpu := 0; cpu < runtime.NumCPU(); cpu++ {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			runtime.LockOSThread() // the thread ends with the goroutine, its affinity with it
			var set unix.CPUSet
			set.Set(cpu)
			if err := unix.SchedSetaffinity(0, &set); err != nil {
				logf("stall watch: pinning to CPU %d: %v", cpu, err)
				return
			}
			last := time.Now()
			for {
				select {
				case <-w.done:
					return
				case <-time.After(stallTick):
				}
				now := time.Now()
				if late := now.Sub(last) - stallTick; late >= stallMin {
					w.mu.Lock()
					w.gaps = append(w.gaps, stall{cpu: cpu, end: now, d: late})
					w.mu.Unlock()
				}
				last = now
			}
		}()
	}
	return w
}

// stop ends the watch and returns the stalls seen.
func (w *stallWatch) stop() []stall {
	close(w.done)
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.gaps
}

// longestStall returns the longest part of a stall that lay within [from, to].
func longestStall(gaps []stall, from, to time.Time) time.Duration {
	var longest time.Duration
	for _, g := range gaps {
		start, end := g.end.Add(-g.d), g.end
		if start.Before(from) {
			start = from
		}
		if end.After(to) {
			end = to
		}
		if d := end.Sub(start); d > longest {
			longest = d
		}
	}
	return longest
}

// observation is traffic plus /healthz polled every second.
type observation struct {
	tr    *traffic
	stop  chan struct{}
	codes <-chan map[int]int
}

func observe(targets []string) *observation {
	o := &observation{tr: startTraffic(targets), stop: make(chan struct{})}
	o.tr.waitFor(20)
	o.codes = probe.PollCodes(healthz, time.Second, o.stop)
	return o
}

func (o *observation) end() ([]result, map[int]int) {
	close(o.stop)
	codes := <-o.codes
	return o.tr.stop(), codes
}
