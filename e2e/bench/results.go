package main

import "time"

// Implementation names, as -impl takes them.
const (
	implOurs     = "ours"
	implUpstream = "upstream"
)

// Ways of configuring the daemons: the config file both accept (minSyncPeriod left at its 1 s default),
// or the equivalent command-line flags alone plus --iptables-min-sync-period=0. Upstream ignores most
// flags when --config is given and turns a 0s minSyncPeriod in a file into 1 s, so the flag is the only
// way to run it at 0; ours takes the same flags.
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
	// Cold is exec → the transaction after which every Service's KUBE-SVC chain jumped to all its
	// endpoints' KUBE-SEP chains; FirstCommit is exec → the daemon's first nf_tables transaction.
	Cold, FirstCommit time.Duration
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
	// RulesPerChange and CommitsPerChange count the rules added or deleted and the transactions
	// committed from each change's API write to the next one's.
	RulesPerChange, CommitsPerChange []int
	// LoopCPU is the daemon's CPU time over the change loop, LoopWall its duration.
	LoopCPU  cpuTimes
	LoopWall time.Duration
	Changes  int
	// ServicesRules is the length of the nat KUBE-SERVICES chain after the cold sync.
	ServicesRules int
	// DataPlane holds the new-connection measurements (config mode only), by target.
	DataPlane map[string]DataPlaneResult
	// DataPlaneMoved is set when the nat table's order changed while the connections were made, so the
	// rules-walked counts are not exact.
	DataPlaneMoved bool
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
}

// phase returns the result of impl in mode, or nil.
func (r *RunResult) phase(impl, mode string) *PhaseResult {
	for i := range r.Phases {
		if r.Phases[i].Impl == impl && r.Phases[i].Mode == mode {
			return &r.Phases[i]
		}
	}
	return nil
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

// FloorSample is one timed restore: exec → last commit, and exec → exit.
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
