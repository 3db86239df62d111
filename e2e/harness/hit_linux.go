package harness

import (
	"context"
	"fmt"
	"os"

	"kube-proxy/e2e/probe"
)

// HitResult is the outcome of one connection made by HitWith (probe.HitResult).
type HitResult = probe.HitResult

// HitOptions tunes HitWith (probe.HitOptions).
type HitOptions = probe.HitOptions

// Hit makes n new connections from inside from (nil: this process's namespace) to addr and counts
// them by answering pod name, with failures counted under "ERR:<class>" (see HitResult.Err).
// network is "tcp", "tcp4", "tcp6", "udp", "udp4" or "udp6". For TCP each connection is fresh and
// carries one request; for UDP each datagram goes from a new socket, hence a new source port.
// The error is for the harness failing (context ended, namespace gone), never for a failed connection.
func Hit(ctx context.Context, from *NetNS, network, addr string, n int) (map[string]int, error) {
	res, err := HitWith(ctx, from, network, addr, n, HitOptions{})
	return CountHits(res), err
}

// HitDetailed is HitWith with default options.
func HitDetailed(ctx context.Context, from *NetNS, network, addr string, n int) ([]HitResult, error) {
	return HitWith(ctx, from, network, addr, n, HitOptions{})
}

// CountHits counts results by pod name, failures under "ERR:<class>" (probe.CountHits).
func CountHits(results []HitResult) map[string]int { return probe.CountHits(results) }

// FormatHits renders counts as "pod1=3 pod2=5 ERR:timeout=1", sorted, for messages (probe.FormatHits).
func FormatHits(m map[string]int) string { return probe.FormatHits(m) }

// HitWith makes n connections like Hit and returns each one's result, in no particular order. If ctx
// ends early it returns the results of the connections made so far with the error. It is
// probe.HitWith from inside from, once from's namespace is known to exist.
func HitWith(ctx context.Context, from *NetNS, network, addr string, n int, opts HitOptions) ([]HitResult, error) {
	if from != nil {
		if _, err := os.Stat(from.Path()); err != nil {
			return nil, fmt.Errorf("hit from %s: %w", from.Name, err)
		}
	}
	return probe.HitWith(ctx, dialer(from), network, addr, n, opts)
}

// dialer returns the probe.Dialer that connects from inside ns (nil, this process's namespace, for nil).
func dialer(ns *NetNS) probe.Dialer {
	if ns == nil {
		return nil
	}
	return ns.DialContext
}
