package main

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"kube-proxy/e2e/harness"
)

// connectTimes makes n rounds of TCP connections from ns, one to each of addrs in turn (so that whatever
// else loads the host affects every target alike), with blocking sockets on one thread, and returns how
// long each connect(2) took, by target: the SYN's way through the node's rules (a new connection walks the
// nat table; later packets follow conntrack) to the pod and the SYN-ACK back. Each connection is then reset
// (SO_LINGER 0), so no TIME_WAIT piles up. warmup rounds go first, uncounted. Failed connections are
// counted, not timed (the first few logged with their error).
func connectTimes(ns *harness.NetNS, addrs []netip.AddrPort, n, warmup int) ([][]time.Duration, []int, error) {
	targets := make([]connTarget, len(addrs))
	for i, a := range addrs {
		targets[i] = connTarget{ns, a}
	}
	return connectRounds(targets, n, warmup)
}

// connTarget is an address connected to from a client namespace.
type connTarget struct {
	from *harness.NetNS
	addr netip.AddrPort
}

// connectRounds is connectTimes with a client namespace per target: from one namespace the whole loop
// runs on a thread in it; from several, each connection enters its namespace first (untimed).
func connectRounds(targets []connTarget, n, warmup int) ([][]time.Duration, []int, error) {
	times := make([][]time.Duration, len(targets))
	failed := make([]int, len(targets))
	one := true
	for _, t := range targets {
		one = one && t.from == targets[0].from
	}
	connect := func(t connTarget) (d time.Duration, err error) {
		if one {
			return connectOnce(t.addr)
		}
		if nerr := t.from.Do(func() error { d, err = connectOnce(t.addr); return nil }); nerr != nil {
			return 0, nerr
		}
		return d, err
	}
	loop := func() error {
		for k := 0; k < warmup+n; k++ {
			for i, t := range targets {
				d, err := connect(t)
				for try := 0; errors.Is(err, unix.EINTR) && try < 5; try++ {
					// A signal (the Go runtime's preemption, SIGURG) interrupted the blocking connect: not a
					// failure of the path, and not a timing; connect again.
					d, err = connect(t)
				}
				if k < warmup {
					continue
				}
				if err != nil {
					failed[i]++
					if failed[i] <= 3 {
						logf("  connection %d to %s failed after %v: %v", k-warmup+1, t.addr, d.Round(time.Millisecond), err)
					}
					continue
				}
				times[i] = append(times[i], d)
			}
		}
		return nil
	}
	if one && len(targets) > 0 {
		return times, failed, targets[0].from.Do(loop)
	}
	return times, failed, loop()
}

// connectOnce times one blocking connect(2) to addr (at most 2 s) and resets the connection.
func connectOnce(addr netip.AddrPort) (time.Duration, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	_ = unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &unix.Timeval{Sec: 2}) // bounds connect
	sa := &unix.SockaddrInet4{Port: int(addr.Port()), Addr: addr.Addr().As4()}
	start := time.Now()
	err = unix.Connect(fd, sa)
	return time.Since(start), err
}

// chainCosts returns, for every chain reachable from KUBE-SERVICES in a saved nat table, how many rules a
// packet walks (from the first rule of KUBE-SERVICES, through every jump on the way) before it enters the
// chain; KUBE-SERVICES itself costs 0. A new connection to a Service that matches nothing earlier walks
// that many rules before reaching its KUBE-SVC chain.
func chainCosts(nat *harness.SavedTable) map[string]int {
	byChain := rulesByChain(nat)
	costs := map[string]int{"KUBE-SERVICES": 0}
	queue := []string{"KUBE-SERVICES"}
	for len(queue) > 0 {
		c := queue[0]
		queue = queue[1:]
		for i, r := range byChain[c] {
			t := ruleTarget(r)
			if t == "" {
				continue
			}
			if _, ok := nat.Chains[t]; !ok {
				continue
			}
			if _, seen := costs[t]; seen {
				continue
			}
			costs[t] = costs[c] + i + 1
			queue = append(queue, t)
		}
	}
	return costs
}

// rulesByChain indexes a saved table's rules by chain, in order.
func rulesByChain(t *harness.SavedTable) map[string][]string {
	out := map[string][]string{}
	for _, r := range t.Rules {
		f := strings.SplitN(r, " ", 3)
		if len(f) >= 2 {
			out[f[1]] = append(out[f[1]], r)
		}
	}
	return out
}

// ruleTarget returns the chain or target after -j or -g in a saved rule.
func ruleTarget(rule string) string {
	f := splitRule(rule)
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "-j" || f[i] == "-g" {
			return f[i+1]
		}
	}
	return ""
}

// splitRule splits a saved rule into words, keeping double-quoted strings (comments) as one word.
func splitRule(rule string) []string {
	var out []string
	cur, inQuote, have := []byte{}, false, false
	for i := 0; i < len(rule); i++ {
		ch := rule[i]
		switch {
		case ch == '"':
			inQuote, have = !inQuote, true
		case ch == ' ' && !inQuote:
			if have {
				out = append(out, string(cur))
			}
			cur, have = cur[:0], false
		default:
			cur, have = append(cur, ch), true
		}
	}
	if have {
		out = append(out, string(cur))
	}
	return out
}
