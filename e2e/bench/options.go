package main

import (
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// options are the command line, exported for results.json.
type options struct {
	N, M  []int
	Runs  int
	Impls []string
	// Modes are the proxy modes measured, in order.
	Modes   []string
	Quick   bool
	Changes int
	// NFTChanges is Changes for mode nftables (0: the same).
	NFTChanges int `json:",omitempty"`
	// Connects is the number of timed connections per data-plane target (0 skips the data plane).
	Connects  int
	Workers   int
	FloorReps int
	// Gap is the pause after each change has landed (plus a random 0–Gap/2), so changes do not coalesce.
	Gap, Settle, ColdTimeout, ChangeTimeout time.Duration
	// ColdCap is the longest a cold start of mode nftables is waited for: one that takes longer is
	// reported with the time and the Services it had reached, and that daemon's run ends there.
	ColdCap time.Duration
	// Quiesce is the longest wait for the host to go idle before each measurement.
	Quiesce        time.Duration
	Seed           uint64
	Output, Outdir string
	Profile        bool
	ProfileSeconds int
	Keep           bool
	// Command is how the benchmark was invoked, for the report.
	Command string
	// From is a results.json to report again instead of measuring.
	From string `json:"-"`
	// Userspace measures mode userspace's data plane beside mode iptables' instead of the control plane.
	Userspace bool `json:",omitempty"`
}

// parseOptions parses args (without the program name).
func parseOptions(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	ns := fs.String("n", "1000,5000,10000", "Service counts, comma-separated (run in ascending order, created incrementally)")
	ms := fs.String("m", "3,10", "endpoints per Service, comma-separated (a fresh cluster for each)")
	fs.IntVar(&o.Runs, "runs", 3, "repetitions per size; the report gives medians and min–max")
	impl := fs.String("impl", "both", "ours, upstream or both")
	modes := fs.String("mode", "iptables,nftables", "proxy modes, comma-separated: iptables, nftables")
	fs.BoolVar(&o.Quick, "quick", false, "CI variant: N=1000, M=3, one run, 20 changes (mode nftables: 6), 200 connections, no BENCHMARKS.md (flags given explicitly still win)")
	fs.IntVar(&o.Changes, "changes", 100, "single-Service changes per implementation and minSyncPeriod (even: adds and removals alternate)")
	fs.IntVar(&o.NFTChanges, "nft-changes", 0, "-changes for mode nftables (0: the same)")
	fs.IntVar(&o.Connects, "connects", 1000, "timed new connections per data-plane target, made round-robin across the targets (0: skip the data plane)")
	fs.IntVar(&o.Workers, "workers", 32, "parallel API writers when creating Services")
	fs.IntVar(&o.FloorReps, "floor-reps", 10, "kernel floor: endpoint additions and as many removals per rule set (0: skip the floors)")
	fs.DurationVar(&o.Gap, "gap", 200*time.Millisecond, "pause after each change has reached the kernel, plus a random 0–gap/2")
	fs.DurationVar(&o.Settle, "settle", 2*time.Second, "wait after the cold sync and after the changes before reading RSS")
	fs.DurationVar(&o.Quiesce, "quiesce", 10*time.Second, "before each daemon run and floor, wait at most this long for the host to be under 20% busy")
	fs.DurationVar(&o.ColdTimeout, "cold-timeout", 30*time.Minute, "longest a cold start may take")
	fs.DurationVar(&o.ColdCap, "cold-cap", 20*time.Minute, "mode nftables: report a cold start still unfinished after this long with what it had reached, and end that daemon's run")
	fs.DurationVar(&o.ChangeTimeout, "change-timeout", 2*time.Minute, "longest one change may take to reach the kernel")
	fs.Uint64Var(&o.Seed, "seed", 1, "seed of the change sequence (the same for every implementation)")
	fs.StringVar(&o.Output, "o", "BENCHMARKS.md", "Markdown file whose sections for the measured sizes are (re)written; empty: none")
	fs.StringVar(&o.Outdir, "outdir", "bin/bench", "directory for results.json, daemon logs and profiles (a timestamped subdirectory per invocation)")
	fs.BoolVar(&o.Profile, "profile", false, "set enableProfiling (both implementations) and save CPU profiles (/debug/pprof) of each cold start (config file) and change loop (minSyncPeriod 0) and heap profiles after the changes; profiles cost the daemons a little, so keep such runs out of the report (-o \"\")")
	fs.IntVar(&o.ProfileSeconds, "profile-seconds", 20, "length of each CPU profile")
	fs.StringVar(&o.From, "from", "", "measure nothing: print (and write to -o) the report of a results.json from an earlier run")
	fs.BoolVar(&o.Keep, "keep", false, "keep the apiserver's and etcd's state directories")
	fs.BoolVar(&o.Userspace, "userspace", false, "measure mode userspace's data plane beside mode iptables' (connection rate, latency, one stream, RSS with 10,000 idle connections) and write its section; the other flags but -o, -outdir and -quiesce do not apply")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if o.Quick {
		quick := map[string]func(){
			"n": func() { *ns = "1000" }, "m": func() { *ms = "3" }, "runs": func() { o.Runs = 1 },
			"changes": func() { o.Changes = 20 }, "nft-changes": func() { o.NFTChanges = 6 }, "connects": func() { o.Connects = 200 },
			"floor-reps": func() { o.FloorReps = 3 }, "settle": func() { o.Settle = time.Second },
			"o": func() { o.Output = "" }, "quiesce": func() { o.Quiesce = 2 * time.Second },
		}
		for name, apply := range quick {
			if !set[name] {
				apply()
			}
		}
	}
	var err error
	if o.N, err = intList(*ns); err != nil {
		return o, fmt.Errorf("-n: %w", err)
	}
	if o.M, err = intList(*ms); err != nil {
		return o, fmt.Errorf("-m: %w", err)
	}
	switch *impl {
	case "both":
		o.Impls = []string{implOurs, implUpstream}
	case implOurs, implUpstream:
		o.Impls = []string{*impl}
	default:
		return o, fmt.Errorf("-impl: want ours, upstream or both, not %q", *impl)
	}
	switch {
	case o.Runs < 1:
		return o, fmt.Errorf("-runs: want at least 1")
	case o.Changes < 2 || o.Changes%2 != 0:
		return o, fmt.Errorf("-changes: want an even number of at least 2")
	case o.Changes/2 > extraBlocks*254:
		return o, fmt.Errorf("-changes: at most %d", 2*extraBlocks*254)
	case o.NFTChanges < 0 || o.NFTChanges%2 != 0 || o.NFTChanges/2 > extraBlocks*254:
		return o, fmt.Errorf("-nft-changes: want an even number of at most %d (0: as -changes)", 2*extraBlocks*254)
	case o.Workers < 1:
		return o, fmt.Errorf("-workers: want at least 1")
	}
	o.Modes = nil
	for _, m := range strings.Split(*modes, ",") {
		m = strings.TrimSpace(m)
		if m != proxyIPTables && m != proxyNFTables {
			return o, fmt.Errorf("-mode: want iptables, nftables or both, comma-separated, not %q", m)
		}
		if !slices.Contains(o.Modes, m) {
			o.Modes = append(o.Modes, m)
		}
	}
	// Mode iptables is measured up to 30,000 Services; mode nftables, whose dispatch does not grow with
	// them, up to 60,000 (the Service CIDR is a /16).
	maxN := 60000
	if slices.Contains(o.Modes, proxyIPTables) {
		maxN = 30000
	}
	for _, n := range o.N {
		if n < 2 || n > maxN {
			return o, fmt.Errorf("-n: %d out of range 2–%d (the Service CIDR is a /16; above 30,000 with -mode nftables only)", n, maxN)
		}
		if o.Changes > n || o.NFTChanges > n {
			return o, fmt.Errorf("-changes %d, -nft-changes %d: more than the %d Services", o.Changes, o.NFTChanges, n)
		}
	}
	for _, m := range o.M {
		if m < 1 || m > 100 {
			return o, fmt.Errorf("-m: %d out of range 1–100", m)
		}
	}
	o.Command = "go run ./e2e/bench " + strings.Join(args, " ")
	return o, nil
}

// changesFor returns the number of changes per implementation and minSyncPeriod in a proxy mode.
func (o options) changesFor(proxy string) int {
	if proxy == proxyNFTables && o.NFTChanges > 0 {
		return o.NFTChanges
	}
	return o.Changes
}

func intList(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		if len(out) > 0 && v <= out[len(out)-1] {
			return nil, fmt.Errorf("%q: give increasing values", s)
		}
		out = append(out, v)
	}
	return out, nil
}
