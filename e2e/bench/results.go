package main

import "time"

// Implementation names, as -impl takes them.
const (
	implOurs     = "ours"
	implUpstream = "upstream"
)

// Proxy modes, as -mode takes them.
const (
	proxyIPTables = "iptables"
	proxyNFTables = "nftables"
)

// Ways of configuring the daemons: the config file both accept (minSyncPeriod left at its 1 s default),
// or the equivalent command-line flags alone plus --iptables-min-sync-period=0. Upstream ignores most
// flags when --config is given and turns a 0s minSyncPeriod in a file into 1 s, so the flag is the only
// way to run it at 0; ours takes the same flags. In mode nftables too: upstream has no nftables flags, its
// --iptables-min-sync-period sets the minSyncPeriod of every mode but ipvs, and a 0s
// nftables.minSyncPeriod in a file becomes 1 s as well.
const (
	modeConfig = "config"
	modeFlags  = "flags"
)

// Endpoint addresses: original endpoints cycle through 10.244.128.1–10.244.247.254, endpoints the change
// loop adds come from 10.244.248.1–10.244.255.254. All are in the pod CIDR and in sinkRange, so any
// Service of the benchmark answers real connections.
const (
	origBlocks  = 120
	extraBlocks = 8
)

// cpuTimes is a process's CPU time: its own, and that of its children it has waited for (the
// iptables-restore and iptables-save runs of a kube-proxy).
type cpuTimes struct {
	Self, Children time.Duration
}

// Total is Self + Children.
func (c cpuTimes) Total() time.Duration { return c.Self + c.Children }

// Sub returns c - o.
func (c cpuTimes) Sub(o cpuTimes) cpuTimes {
	return cpuTimes{Self: c.Self - o.Self, Children: c.Children - o.Children}
}

// memory is a process's resident set, now and at its peak, in bytes.
type memory struct {
	RSS, HWM int64
}

// PhaseResult is what one daemon run in one fresh node namespace measured.
type PhaseResult struct {
	Impl string
	// Mode is modeConfig (the config file, minSyncPeriod 1 s) or modeFlags (flags, minSyncPeriod 0).
	Mode string
	// Proxy is the proxy mode, proxyIPTables or proxyNFTables ("" in results from before mode nftables
	// was measured: iptables).
	Proxy string `json:",omitempty"`
	// Skipped is set when the run was not made (flags mode, after the config file's cold start was
	// capped).
	Skipped bool `json:",omitempty"`
	// Cold is exec → the transaction after which every Service's KUBE-SVC chain jumped to all its
	// endpoints' KUBE-SEP chains (mode nftables: after which the service-ips element of every Service
	// sent its cluster IP to a chain whose DNAT reaches all its endpoints); FirstCommit is exec → the
	// daemon's first nf_tables transaction.
	Cold, FirstCommit time.Duration
	// ColdCapped is set when a cold start of mode nftables did not finish within -cold-cap: Cold is then
	// how long it ran, ColdProgress how many Services were complete by then, and nothing else was
	// measured but CPU, transactions and memory until then.
	ColdCapped   bool `json:",omitempty"`
	ColdProgress int  `json:",omitempty"`
	// CappedChildren describes the daemon's children still running at the cap (e.g. its nft).
	CappedChildren []string `json:",omitempty"`
	// ColdAfterCap is exec → the commit that completed the cold sync, when what the daemon left running
	// at the cap (it is stopped there) committed it within another cap; 0 otherwise.
	ColdAfterCap time.Duration `json:",omitempty"`
	// ColdCommits counts the transactions up to the complete one.
	ColdCommits int
	// ColdCPU is the daemon's CPU time (and its children's) from exec to the complete transaction.
	ColdCPU cpuTimes
	// MemCold is read a settle time after the cold sync, MemAfter a settle time after the changes.
	MemCold, MemAfter memory
	// Latencies are API write returned → change in the kernel, one per change, in order.
	Latencies []time.Duration
	// Early counts changes in the kernel before the API write had returned (counted as 0).
	Early int
	// RulesPerChange, ElemsPerChange and CommitsPerChange count the rules and the set or map elements
	// added or deleted and the transactions committed from each change's API write to the next one's.
	RulesPerChange, CommitsPerChange []int
	ElemsPerChange                   []int `json:",omitempty"`
	// LoopCPU is the daemon's CPU time over the change loop, LoopWall its duration.
	LoopCPU  cpuTimes
	LoopWall time.Duration
	Changes  int
	// ServicesRules is the length of the nat KUBE-SERVICES chain after the cold sync (mode nftables: the
	// number of TCP elements of the service-ips map).
	ServicesRules int
	// DataPlane holds the new-connection measurements (config mode only), by target.
	DataPlane map[string]DataPlaneResult
	// DataPlaneMoved is set when the nat table's order changed while the connections were made, so the
	// rules-walked counts are not exact.
	DataPlaneMoved bool
	// RestoreUnseen is set when the monitor did not see the changed Services back at their original
	// endpoints before the data plane, though the kernel then showed them so.
	RestoreUnseen bool `json:",omitempty"`
	// MonitorLost counts the observer's socket overflows (each followed by a re-read of the kernel).
	MonitorLost int
}

// DataPlaneResult is one target's sequential connect(2) latencies.
type DataPlaneResult struct {
	Addr string
	// RulesWalked is how many nat rules a new connection walks before its KUBE-SVC chain, read right
	// before the connections; for a pod IP, the length of KUBE-SERVICES.
	RulesWalked   int
	P50, P90      time.Duration
	Samples, Fail int
}

// Data plane targets.
const (
	dpFirst   = "first-created Service"
	dpLast    = "last-created Service"
	dpDeepest = "deepest Service (most rules walked)"
	dpPod     = "an endpoint's pod IP (no Service)"
	// dpBare is mode nftables' in-loop floor: a pod IP through another node, with no rules at all.
	dpBare = "a pod IP through a node with no rules (same rounds)"
)

var dpTargets = []string{dpFirst, dpLast, dpDeepest, dpPod}

// RunResult is one repetition at one size: every implementation in both modes, and the kernel floors.
type RunResult struct {
	N, M, Run int
	// Created is how long creating this size's Services and EndpointSlices took (only the ones added
	// since the previous size), Objects how many API objects that was; set on the first run.
	Created time.Duration
	Objects int
	Phases  []PhaseResult
	Floors  Floors
	// NFTFloors are the floors of mode nftables (nil when not measured).
	NFTFloors *NFTFloors `json:",omitempty"`
}

// phase returns the result of impl in mode of the proxy mode the run holds (see only), or nil; a run
// skipped counts as none.
func (r *RunResult) phase(impl, mode string) *PhaseResult {
	for i := range r.Phases {
		if p := &r.Phases[i]; p.Impl == impl && p.Mode == mode && !p.Skipped {
			return p
		}
	}
	return nil
}

// phaseOf returns the result of impl in mode and proxy mode proxy, or nil.
func (r *RunResult) phaseOf(proxy, impl, mode string) *PhaseResult {
	for i := range r.Phases {
		if p := &r.Phases[i]; p.proxy() == proxy && p.Impl == impl && p.Mode == mode {
			return p
		}
	}
	return nil
}

// proxy returns the proxy mode of the result.
func (p *PhaseResult) proxy() string {
	if p.Proxy == "" {
		return proxyIPTables
	}
	return p.Proxy
}

// only returns a copy of r holding the results of one proxy mode, and whether there are any.
func (r *RunResult) only(proxy string) (RunResult, bool) {
	c := *r
	c.Phases = nil
	for _, p := range r.Phases {
		if p.proxy() == proxy {
			c.Phases = append(c.Phases, p)
		}
	}
	return c, len(c.Phases) > 0
}

// Floors are what the kernel (iptables-nft-restore --noflush) minimally takes for the same work, timed in
// fresh namespaces with no daemon running, in the same run as the daemons, with the monitor listening.
type Floors struct {
	// Whole is the restore of an implementation's whole payload (nat + filter + mangle, as iptables-save
	// printed it after its cold sync, chain declarations sorted) into an empty namespace, by
	// implementation.
	Whole map[string]FloorSample
	// Change is the restore of one Service's own lines in the shapes the implementation wrote them (its
	// KUBE-SVC chain rewritten, one KUBE-SEP chain added or deleted: an endpoint change), over that
	// implementation's full rule set: every sample, additions and removals alternating.
	Change map[string][]FloorSample
	// ChangeUnmonitored is Change over ours' rule set with no monitor listening (Wall only): compared
	// with Change it shows the observer's own cost to the kernel.
	ChangeUnmonitored []FloorSample
	// ChangeAndServices is Change plus a rewrite of the whole KUBE-SERVICES chain, over upstream's rule
	// set: what each partial sync of upstream writes to the nat table at least.
	ChangeAndServices []FloorSample
	// Connect is the data plane's floor: new connections to a pod IP through a fresh node namespace with
	// no rules at all (nil when not measured).
	Connect *DataPlaneResult `json:",omitempty"`
}

// NFTFloors are what nft minimally takes for the work of mode nftables, in a fresh namespace with no
// daemon running and the monitor listening, in the same run as the daemons.
type NFTFloors struct {
	// Source is the implementation whose `nft list table ip kube-proxy` (after its cold sync) was loaded.
	Source string
	// Whole is that listing loaded by one `nft -f` into the empty namespace.
	Whole FloorSample
	// LoadCapped is set (to the cap) when that load did not finish within -cold-cap: it was given up, and
	// Whole and Change are empty.
	LoadCapped time.Duration `json:",omitempty"`
	// Change is one Service's endpoint change over that table, as upstream's writer words it (the
	// Service's chain added and flushed, its DNAT rule added with the new endpoints), by `nft -f`: every
	// sample, additions and removals alternating.
	Change []FloorSample
}

// FloorSample is one timed restore (or nft -f): exec → last commit, and exec → exit.
type FloorSample struct {
	Commit, Wall time.Duration
}

// modeLabel describes a mode for the report.
func modeLabel(mode string) string {
	if mode == modeFlags {
		return "flags, minSyncPeriod 0"
	}
	return "config file, minSyncPeriod 1s"
}
