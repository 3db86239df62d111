package main

import (
	"fmt"
	"strings"
)

// nftMetrics are mode nftables' rows: those of mode iptables that apply there, worded for nft, plus the
// set and map elements written per change.
var nftMetrics, nftUnfinished = func() ([]metric, map[string]func(*RunResult, string) bool) {
	unfinished := map[string]func(*RunResult, string) bool{}
	words := strings.NewReplacer(
		"every Service's rules in the kernel", "every Service's map element and DNAT in the kernel",
		"its iptables children", "its nft children",
		"in iptables-restore/-save", "in nft")
	var out []metric
	for _, mt := range metrics {
		if strings.HasPrefix(mt.name, "KUBE-SERVICES") || strings.HasSuffix(mt.name, dpDeepest) {
			continue
		}
		mt.name = words.Replace(mt.name)
		switch {
		case strings.HasPrefix(mt.name, "cold start:"):
			unfinished[mt.name] = coldCapped(modeConfig)
		case strings.HasPrefix(mt.name, "cold start,"):
			unfinished[mt.name] = coldCapped(modeFlags)
		}
		out = append(out, mt)
		if strings.HasSuffix(mt.name, dpPod) {
			out = append(out, metric{"new connection p50: " + dpBare, unitSeconds, dataPlane(dpBare)})
		}
		if strings.HasPrefix(mt.name, "rules added + deleted") {
			out = append(out, metric{"set and map elements added + deleted in the kernel per change (median)", unitCount,
				phaseMetric(modeFlags, func(p *PhaseResult) (float64, bool) {
					return float64(medianInt(p.ElemsPerChange)), len(p.ElemsPerChange) > 0
				})})
		}
	}
	return out, unfinished
}()

// coldCapped reports whether impl's cold start in mode was capped.
func coldCapped(mode string) func(*RunResult, string) bool {
	return func(r *RunResult, impl string) bool {
		p := r.phase(impl, mode)
		return p != nil && p.ColdCapped
	}
}

// metricOf returns the first of ms whose name starts with prefix.
func metricOf(ms []metric, prefix string) metric {
	for _, mt := range ms {
		if strings.HasPrefix(mt.name, prefix) {
			return mt
		}
	}
	panic("no metric " + prefix)
}

// nftTarget is one of the targets for mode nftables: ours (num) over a reference (den), per run,
// at most limit.
type nftTarget struct {
	name  string
	limit float64
	unit  unit
	num   func(*RunResult, string) (float64, bool)
	den   func(*RunResult) (float64, bool)
	// bound is set when den is, in a run, the time a capped cold start had reached: the ratio is then an
	// upper bound.
	bound func(*RunResult) bool
}

// upstreamOf is a metric's value for upstream, as a reference.
func upstreamOf(get func(*RunResult, string) (float64, bool)) func(*RunResult) (float64, bool) {
	return func(r *RunResult) (float64, bool) { return get(r, implUpstream) }
}

// bareFloor is ours' new connections through a node with no rules, in the same rounds as its targets
// (else the run's separate data-plane floor), p50 in seconds.
func bareFloor(r *RunResult) (float64, bool) {
	if v, ok := dataPlane(dpBare)(r, implOurs); ok {
		return v, true
	}
	return connectFloor(r)
}

// nftChangeFloor is a run's nft -f of one Service's change, median to the commit, in seconds.
func nftChangeFloor(r *RunResult) (float64, bool) {
	if r.NFTFloors == nil || len(r.NFTFloors.Change) == 0 {
		return 0, false
	}
	return floorP50(r.NFTFloors.Change, true).Seconds(), true
}

func nftTargets() []nftTarget {
	cold := metricOf(nftMetrics, "cold start:")
	rss := func(prefix string) func(*RunResult, string) (float64, bool) { return metricOf(nftMetrics, prefix).get }
	np := latency(modeFlags, 0.5)
	upCapped := func(r *RunResult) bool { return coldCapped(modeConfig)(r, implUpstream) }
	return []nftTarget{
		{"cold start ≤ 0.2× upstream (config file)", 0.2, unitSeconds, cold.get, upstreamOf(cold.get), upCapped},
		{"network programming p50 at minSyncPeriod 0 ≤ 0.3× upstream", 0.3, unitSeconds, np, upstreamOf(np), nil},
		{"… and ≤ 1.5× a bare `nft -f` of the same change over the same table (both to the commit)", 1.5, unitSeconds, np, nftChangeFloor, nil},
		{"RSS after the cold sync ≤ 0.5× upstream", 0.5, unitBytes, rss("RSS after the cold"), upstreamOf(rss("RSS after the cold")), nil},
		{"RSS after the changes ≤ 0.5× upstream", 0.5, unitBytes, rss("RSS after the changes"), upstreamOf(rss("RSS after the changes")), nil},
		{"new connection to the last-created Service ≤ 1.3× one through a node with no rules (in the same rounds)", 1.3, unitSeconds,
			dataPlane(dpLast), bareFloor, nil},
	}
}

// renderNFTTargets is the targets, each ratio computed within each run.
func renderNFTTargets(g group) string {
	var b strings.Builder
	b.WriteString("\n| target (the issue's, set for 10,000 × 3) | measured: ours vs the reference, ratio per run | |\n|---|---|---|\n")
	for _, t := range nftTargets() {
		v := g.perRun(t.num, implOurs, t.den)
		if len(v) == 0 {
			fmt.Fprintf(&b, "| %s | not measured | |\n", t.name)
			continue
		}
		var den []float64
		for _, r := range g.Runs {
			if x, ok := t.den(r); ok {
				den = append(den, x)
			}
		}
		s := spreadOf(v)
		verdict := "met"
		bound := t.bound != nil && g.any(t.bound)
		switch {
		case s.Median > t.limit && bound:
			verdict = "open: upstream did not finish, its true ratio is lower"
		case s.Median > t.limit:
			verdict = "**not met**"
		case bound:
			verdict = "met (upstream did not finish: the ratio is an upper bound)"
		}
		fmt.Fprintf(&b, "| %s | %s vs %s: %s | %s |\n", t.name, formatSpread(spreadOf(g.values(t.num, implOurs)), t.unit),
			formatSpread(spreadOf(den), t.unit), formatRatioSpread(s), verdict)
	}
	return b.String()
}

// renderNFTGroup renders one size's tables of mode nftables in Markdown.
func renderNFTGroup(g group, o options, m machineInfo) string {
	var b strings.Builder
	fmt.Fprintf(&b, "### Mode nftables: %s Services × %d endpoints\n\n", thousands(int64(g.N)), g.M)
	machine := m.oneLine()
	if m.NFT != "" {
		machine += ", " + m.NFT
	}
	b.WriteString(renderHeader(g, o, o.changesFor(proxyNFTables), machine, m))
	b.WriteString(renderNFTTargets(g))
	b.WriteString(renderTable(g, nftMetrics, nftUnfinished))
	b.WriteString(renderNFTFloors(g))
	b.WriteString(renderNFTConnect(g))
	b.WriteString(renderConnectFloor(g))
	b.WriteString(renderNotes(g, false))
	return b.String()
}

// renderNFTFloors is the nft -f floors, and ours and upstream over the change's.
func renderNFTFloors(g group) string {
	var whole, wholeWall, change, changeWall []float64
	source, capped := "", ""
	for _, r := range g.Runs {
		if f := r.NFTFloors; f != nil && f.LoadCapped > 0 {
			source, capped = f.Source, formatValue(f.LoadCapped.Seconds(), unitSeconds)
			continue
		}
		if f := r.NFTFloors; f != nil {
			source = f.Source
			whole, wholeWall = append(whole, f.Whole.Commit.Seconds()), append(wholeWall, f.Whole.Wall.Seconds())
			if len(f.Change) > 0 {
				change = append(change, floorP50(f.Change, true).Seconds())
				changeWall = append(changeWall, floorP50(f.Change, false).Seconds())
			}
		}
	}
	if len(whole) == 0 && capped == "" {
		return ""
	}
	var b strings.Builder
	b.WriteString("\n| kernel floor: `nft -f`, no daemon running (median) | exec → committed | exec → exited |\n|---|---|---|\n")
	if len(whole) == 0 {
		fmt.Fprintf(&b, "| the table %s listed after its cold sync, loaded into an empty namespace (one transaction) | not within %s (given up) | |\n", source, capped)
		return b.String()
	}
	fmt.Fprintf(&b, "| the table %s listed after its cold sync, loaded into an empty namespace (one transaction) | %s | %s |\n", source,
		formatSpread(spreadOf(whole), unitSeconds), formatSpread(spreadOf(wholeWall), unitSeconds))
	if len(change) > 0 {
		fmt.Fprintf(&b, "| one Service's endpoint change over that table, as upstream's writer words it (add chain, flush chain, add rule with the endpoints' numgen map) | %s | %s |\n",
			formatSpread(spreadOf(change), unitSeconds), formatSpread(spreadOf(changeWall), unitSeconds))
		b.WriteString("\n| network programming p50 at minSyncPeriod 0 ÷ that change's `nft -f`, both to the commit (target for ours ≤ 1.5×) | ratio |\n|---|---|\n")
		for _, impl := range []string{implOurs, implUpstream} {
			if v := g.perRun(latency(modeFlags, 0.5), impl, nftChangeFloor); len(v) > 0 {
				fmt.Fprintf(&b, "| %s | %s |\n", impl, formatRatioSpread(spreadOf(v)))
			}
		}
	}
	return b.String()
}

// renderNFTConnect divides each implementation's new-connection p50s by those through a node with no
// rules made in the same rounds.
func renderNFTConnect(g group) string {
	var b strings.Builder
	header := false
	for _, t := range []string{dpLast, dpFirst, dpPod} {
		var cells [2]string
		for k, impl := range []string{implOurs, implUpstream} {
			cells[k] = "–"
			var v []float64
			for _, r := range g.Runs {
				a, ok := dataPlane(t)(r, impl)
				c, ok2 := dataPlane(dpBare)(r, impl)
				if ok && ok2 && c > 0 {
					v = append(v, a/c)
				}
			}
			if len(v) > 0 {
				cells[k] = formatRatioSpread(spreadOf(v))
			}
		}
		if cells == [2]string{"–", "–"} {
			continue
		}
		if !header {
			b.WriteString("\n| new connection p50 ÷ one through a node with no rules, in the same rounds (target for ours' last-created ≤ 1.3×) | ours | upstream |\n|---|---|---|\n")
			header = true
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", t, cells[0], cells[1])
	}
	return b.String()
}
