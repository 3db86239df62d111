package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"
)

// unit says how a metric's values print.
type unit int

const (
	unitSeconds unit = iota // durations as float64 seconds
	unitBytes
	unitCount
)

// metric is one row of the comparison table: a value per run and implementation.
type metric struct {
	name string
	unit unit
	get  func(r *RunResult, impl string) (float64, bool)
}

func phaseMetric(mode string, f func(p *PhaseResult) (float64, bool)) func(*RunResult, string) (float64, bool) {
	return func(r *RunResult, impl string) (float64, bool) {
		p := r.phase(impl, mode)
		if p == nil {
			return 0, false
		}
		return f(p)
	}
}

func secs(d time.Duration) (float64, bool) { return d.Seconds(), true }

func latency(mode string, p float64) func(*RunResult, string) (float64, bool) {
	return phaseMetric(mode, func(ph *PhaseResult) (float64, bool) {
		if len(ph.Latencies) == 0 {
			return 0, false
		}
		return secs(percentile(ph.Latencies, p))
	})
}

func cpuPerChange(mode string) func(*RunResult, string) (float64, bool) {
	return phaseMetric(mode, func(ph *PhaseResult) (float64, bool) {
		if ph.Changes == 0 {
			return 0, false
		}
		return ph.LoopCPU.Total().Seconds() / float64(ph.Changes), true
	})
}

func dataPlane(target string) func(*RunResult, string) (float64, bool) {
	return phaseMetric(modeConfig, func(ph *PhaseResult) (float64, bool) {
		d, ok := ph.DataPlane[target]
		if !ok || d.Samples == 0 {
			return 0, false
		}
		return secs(d.P50)
	})
}

var metrics = []metric{
	{"cold start: exec → every Service's rules in the kernel (config file)", unitSeconds,
		phaseMetric(modeConfig, func(p *PhaseResult) (float64, bool) { return secs(p.Cold) })},
	{"cold start, second sample (flags, minSyncPeriod 0)", unitSeconds,
		phaseMetric(modeFlags, func(p *PhaseResult) (float64, bool) { return secs(p.Cold) })},
	{"  CPU until then, daemon + its iptables children", unitSeconds,
		phaseMetric(modeConfig, func(p *PhaseResult) (float64, bool) { return p.ColdCPU.Total().Seconds(), true })},
	{"  of which in iptables-restore/-save (children)", unitSeconds,
		phaseMetric(modeConfig, func(p *PhaseResult) (float64, bool) { return p.ColdCPU.Children.Seconds(), true })},
	{"  nf_tables transactions until then", unitCount,
		phaseMetric(modeConfig, func(p *PhaseResult) (float64, bool) { return float64(p.ColdCommits), true })},
	{"network programming p50, minSyncPeriod 1 s", unitSeconds, latency(modeConfig, 0.5)},
	{"network programming p99, minSyncPeriod 1 s", unitSeconds, latency(modeConfig, 0.99)},
	{"network programming p50, minSyncPeriod 0", unitSeconds, latency(modeFlags, 0.5)},
	{"network programming p99, minSyncPeriod 0", unitSeconds, latency(modeFlags, 0.99)},
	{"CPU per change, minSyncPeriod 1 s (daemon + children)", unitSeconds, cpuPerChange(modeConfig)},
	{"CPU per change, minSyncPeriod 0 (daemon + children)", unitSeconds, cpuPerChange(modeFlags)},
	{"  of which in iptables-restore/-save (children)", unitSeconds,
		phaseMetric(modeFlags, func(p *PhaseResult) (float64, bool) {
			return p.LoopCPU.Children.Seconds() / float64(p.Changes), p.Changes > 0
		})},
	{"rules added + deleted in the kernel per change (median)", unitCount,
		phaseMetric(modeFlags, func(p *PhaseResult) (float64, bool) {
			return float64(medianInt(p.RulesPerChange)), len(p.RulesPerChange) > 0
		})},
	{"nf_tables transactions per change (median)", unitCount,
		phaseMetric(modeFlags, func(p *PhaseResult) (float64, bool) {
			return float64(medianInt(p.CommitsPerChange)), len(p.CommitsPerChange) > 0
		})},
	{"RSS after the cold sync", unitBytes,
		phaseMetric(modeConfig, func(p *PhaseResult) (float64, bool) { return float64(p.MemCold.RSS), p.MemCold.RSS > 0 })},
	{"RSS after the changes", unitBytes,
		phaseMetric(modeConfig, func(p *PhaseResult) (float64, bool) { return float64(p.MemAfter.RSS), p.MemAfter.RSS > 0 })},
	{"peak RSS (VmHWM)", unitBytes,
		phaseMetric(modeConfig, func(p *PhaseResult) (float64, bool) { return float64(p.MemAfter.HWM), p.MemAfter.HWM > 0 })},
	{"KUBE-SERVICES rules (nat)", unitCount,
		phaseMetric(modeConfig, func(p *PhaseResult) (float64, bool) { return float64(p.ServicesRules), true })},
	{"new connection p50: " + dpLast, unitSeconds, dataPlane(dpLast)},
	{"new connection p50: " + dpFirst, unitSeconds, dataPlane(dpFirst)},
	{"new connection p50: " + dpDeepest, unitSeconds, dataPlane(dpDeepest)},
	{"new connection p50: " + dpPod, unitSeconds, dataPlane(dpPod)},
}

// group is the results of one size.
type group struct {
	N, M int
	Runs []*RunResult
}

func groups(results []RunResult) []group {
	var out []group
	for i := range results {
		r := &results[i]
		k := slices.IndexFunc(out, func(g group) bool { return g.N == r.N && g.M == r.M })
		if k < 0 {
			out = append(out, group{N: r.N, M: r.M})
			k = len(out) - 1
		}
		out[k].Runs = append(out[k].Runs, r)
	}
	slices.SortFunc(out, func(a, b group) int {
		if a.M != b.M {
			return a.M - b.M
		}
		return a.N - b.N
	})
	return out
}

// values collects a metric over a group's runs.
func (g group) values(get func(*RunResult, string) (float64, bool), impl string) []float64 {
	var v []float64
	for _, r := range g.Runs {
		if x, ok := get(r, impl); ok {
			v = append(v, x)
		}
	}
	return v
}

func formatValue(x float64, u unit) string {
	switch u {
	case unitBytes:
		return fmt.Sprintf("%.0f MiB", x/(1<<20))
	case unitCount:
		return thousands(int64(x + 0.5))
	}
	switch {
	case x == 0:
		return "0"
	case x >= 100:
		return fmt.Sprintf("%.0f s", x)
	case x >= 1:
		return fmt.Sprintf("%.2f s", x)
	case x >= 0.01:
		return fmt.Sprintf("%.0f ms", x*1e3)
	case x >= 0.001:
		return fmt.Sprintf("%.1f ms", x*1e3)
	default:
		return fmt.Sprintf("%.0f µs", x*1e6)
	}
}

func formatSpread(s spread, u unit) string {
	if s.N == 0 {
		return "–"
	}
	v := formatValue(s.Median, u)
	if s.N > 1 && s.Min != s.Max {
		v += " (" + formatValue(s.Min, u) + "–" + formatValue(s.Max, u) + ")"
	}
	return v
}

func thousands(v int64) string {
	s := fmt.Sprint(v)
	if v < 0 {
		return "-" + thousands(-v)
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func ratio(a, b spread) string {
	if a.N == 0 || b.N == 0 || b.Median == 0 {
		return "–"
	}
	return fmt.Sprintf("%.3g×", a.Median/b.Median)
}

// renderGroup renders one size's tables of mode iptables in Markdown.
func renderGroup(g group, o options, m machineInfo) string {
	var b strings.Builder
	fmt.Fprintf(&b, "### %s Services × %d endpoints\n\n", thousands(int64(g.N)), g.M)
	b.WriteString(renderHeader(g, o, o.Changes, m.oneLine(), m))
	b.WriteString(renderTable(g, metrics, nil))
	b.WriteString(renderFloors(g))
	b.WriteString(renderNotes(g, true))
	return b.String()
}

// renderHeader is a section's list of how, when and on what it was measured.
func renderHeader(g group, o options, changes int, machine string, m machineInfo) string {
	var b strings.Builder
	fmt.Fprintf(&b, "- Command: `%s`\n", o.Command)
	fmt.Fprintf(&b, "- Date: %s; runs: %d (medians, min–max in parentheses); %d changes per implementation and minSyncPeriod; %d connections per data-plane target\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), len(g.Runs), changes, o.Connects)
	fmt.Fprintf(&b, "- Machine: %s\n", machine)
	fmt.Fprintf(&b, "- Binaries: %s; repository at %s\n", m.versions(), m.Commit)
	for _, r := range g.Runs {
		if r.Created > 0 {
			fmt.Fprintf(&b, "- Creating the %s Services added for this size (%s API objects: Services and EndpointSlices; %d parallel writers, no client-side rate limit) took %s, %.0f objects/s\n",
				thousands(int64(r.Objects/2)), thousands(int64(r.Objects)), o.Workers, formatValue(r.Created.Seconds(), unitSeconds), float64(r.Objects)/r.Created.Seconds())
		}
	}
	return b.String()
}

// renderTable is the comparison table of ms: medians per implementation and their ratio. unfinished
// names the rows whose value, in a run, can be the time a capped cold start had reached (marked so).
func renderTable(g group, ms []metric, unfinished map[string]func(*RunResult, string) bool) string {
	var b strings.Builder
	b.WriteString("\n| | ours | upstream | ours ÷ upstream |\n|---|---|---|---|\n")
	for _, mt := range ms {
		ours, up := spreadOf(g.values(mt.get, implOurs)), spreadOf(g.values(mt.get, implUpstream))
		if ours.N == 0 && up.N == 0 {
			continue
		}
		cells := [2]string{formatSpread(ours, mt.unit), formatSpread(up, mt.unit)}
		for k, impl := range []string{implOurs, implUpstream} {
			if f := unfinished[mt.name]; f != nil && g.any(func(r *RunResult) bool { return f(r, impl) }) {
				cells[k] += " (unfinished: cap)"
			}
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", mt.name, cells[0], cells[1], ratio(ours, up))
	}
	return b.String()
}

// any reports whether f holds for one of the group's runs.
func (g group) any(f func(r *RunResult) bool) bool {
	return slices.ContainsFunc(g.Runs, f)
}

func renderFloors(g group) string {
	type row struct {
		name    string
		samples func(r *RunResult) []FloorSample
		commit  bool // also show exec → commit
	}
	whole := func(impl string) func(*RunResult) []FloorSample {
		return func(r *RunResult) []FloorSample {
			if s, ok := r.Floors.Whole[impl]; ok {
				return []FloorSample{s}
			}
			return nil
		}
	}
	rows := []row{
		{"whole payload of ours, into an empty namespace", whole(implOurs), true},
		{"whole payload of upstream, into an empty namespace", whole(implUpstream), true},
		{"one Service's own lines for an endpoint change (KUBE-SVC + one KUBE-SEP), ours' shapes over ours' rules",
			func(r *RunResult) []FloorSample { return r.Floors.Change[implOurs] }, true},
		{"the same in upstream's shapes over upstream's rules",
			func(r *RunResult) []FloorSample { return r.Floors.Change[implUpstream] }, true},
		{"the same plus a full KUBE-SERVICES rewrite (what each upstream partial sync writes to nat at least)",
			func(r *RunResult) []FloorSample { return r.Floors.ChangeAndServices }, true},
		{"one Service's lines over ours' rules, no monitor listening (the observer's own cost)",
			func(r *RunResult) []FloorSample { return r.Floors.ChangeUnmonitored }, false},
	}
	var b strings.Builder
	header := false
	for _, rw := range rows {
		var commit, wall []float64
		for _, r := range g.Runs {
			if s := rw.samples(r); len(s) > 0 {
				commit = append(commit, floorP50(s, true).Seconds())
				wall = append(wall, floorP50(s, false).Seconds())
			}
		}
		if len(wall) == 0 {
			continue
		}
		if !header {
			b.WriteString("\n| kernel floor: `iptables-nft-restore --noflush`, no daemon running (median) | exec → committed | exec → exited |\n|---|---|---|\n")
			header = true
		}
		c := "–"
		if rw.commit {
			c = formatSpread(spreadOf(commit), unitSeconds)
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", rw.name, c, formatSpread(spreadOf(wall), unitSeconds))
	}
	if !header {
		return ""
	}
	// The targets, as ratios of ours to the floors (both measured to the commit).
	target := func(name string, num func(*RunResult, string) (float64, bool), den func(*RunResult) []FloorSample) {
		var v []float64
		for _, r := range g.Runs {
			a, ok := num(r, implOurs)
			c := floorP50(den(r), true).Seconds()
			if ok && c > 0 {
				v = append(v, a/c)
			}
		}
		if len(v) > 0 {
			fmt.Fprintf(&b, "| %s | %s |\n", name, formatRatioSpread(spreadOf(v)))
		}
	}
	b.WriteString("\n| ours against the floors, both to the commit (target ≤ 1.5×) | ratio |\n|---|---|\n")
	target("cold start ÷ whole-payload restore of ours' payload", metrics[0].get, whole(implOurs))
	target("network programming p50 at minSyncPeriod 0 ÷ one-change restore over ours' rules", latency(modeFlags, 0.5),
		func(r *RunResult) []FloorSample { return r.Floors.Change[implOurs] })
	b.WriteString(renderConnectFloor(g, dpLast))
	return b.String()
}

// renderConnectFloor adds the data plane's floor (no rules at all) and each implementation's new-connection
// p50 to each target over it.
func renderConnectFloor(g group, targets ...string) string {
	var floor []float64
	for _, r := range g.Runs {
		if c := r.Floors.Connect; c != nil && c.Samples > 0 {
			floor = append(floor, c.P50.Seconds())
		}
	}
	if len(floor) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n| data-plane floor: new connections to a pod IP through a node with no rules (median) | p50 |\n|---|---|\n| no kube-proxy at all | %s |\n",
		formatSpread(spreadOf(floor), unitSeconds))
	for _, impl := range []string{implOurs, implUpstream} {
		for _, t := range targets {
			if v := g.perRun(dataPlane(t), impl, connectFloor); len(v) > 0 {
				fmt.Fprintf(&b, "| %s: %s ÷ that floor | %s |\n", impl, t, formatRatioSpread(spreadOf(v)))
			}
		}
	}
	return b.String()
}

// connectFloor is a run's data-plane floor, p50 in seconds.
func connectFloor(r *RunResult) (float64, bool) {
	if c := r.Floors.Connect; c != nil && c.Samples > 0 && c.P50 > 0 {
		return c.P50.Seconds(), true
	}
	return 0, false
}

// perRun returns, for every run where both exist, num (of impl) divided by den.
func (g group) perRun(num func(*RunResult, string) (float64, bool), impl string, den func(*RunResult) (float64, bool)) []float64 {
	var v []float64
	for _, r := range g.Runs {
		a, ok := num(r, impl)
		c, ok2 := den(r)
		if ok && ok2 && c > 0 {
			v = append(v, a/c)
		}
	}
	return v
}

func formatRatioSpread(s spread) string {
	v := fmt.Sprintf("%.2f×", s.Median)
	if lo, hi := fmt.Sprintf("%.2f", s.Min), fmt.Sprintf("%.2f", s.Max); s.N > 1 && lo != hi {
		v += fmt.Sprintf(" (%s–%s×)", lo, hi)
	}
	return v
}

// renderNotes lists what went unusually in the runs, and with walked the nat rules walked to each
// data-plane target (mode iptables).
func renderNotes(g group, walked bool) string {
	var notes []string
	for _, r := range g.Runs {
		for _, p := range r.Phases {
			label := fmt.Sprintf("run %d, %s, %s", r.Run, p.Impl, modeLabel(p.Mode))
			if p.Skipped {
				notes = append(notes, label+": not run, since the cold start with the config file did not finish within the cap")
			}
			if p.ColdCapped {
				running := ""
				if len(p.CappedChildren) > 0 {
					running = "; still running: " + strings.Join(p.CappedChildren, ", ")
				}
				if p.ColdAfterCap > 0 {
					running += fmt.Sprintf(" (its transaction, left to finish after the daemon was stopped, completed every Service %s after exec)",
						formatValue(p.ColdAfterCap.Seconds(), unitSeconds))
				}
				notes = append(notes, fmt.Sprintf("%s: the cold start had not finished after %s (the cap), with %s of %s Services' rules complete in the kernel and %s transactions committed%s; the cold-start figures are the time it had reached and the CPU used until then (children's only once reaped), and nothing else was measured in that run",
					label, formatValue(p.Cold.Seconds(), unitSeconds), thousands(int64(p.ColdProgress)), thousands(int64(g.N)), thousands(int64(p.ColdCommits)), running))
			}
			if p.MonitorLost > 0 {
				notes = append(notes, fmt.Sprintf("%s: the monitor's socket overflowed %d times (the model was re-read from the kernel each time)", label, p.MonitorLost))
			}
			if p.RestoreUnseen {
				notes = append(notes, label+": the monitor did not see the changed Services restored before the data plane, though a re-read of the kernel showed them so")
			}
			if p.DataPlaneMoved {
				notes = append(notes, fmt.Sprintf("%s: the nat table was rewritten in another order while the connections were made", label))
			}
			if p.Early > 0 {
				notes = append(notes, fmt.Sprintf("%s: %d changes were in the kernel before the API write returned (counted as 0)", label, p.Early))
			}
			for _, t := range dpTargets {
				if d, ok := p.DataPlane[t]; ok && d.Fail > 0 {
					notes = append(notes, fmt.Sprintf("%s: %d of %d connections to %s failed", label, d.Fail, d.Fail+d.Samples, t))
				}
			}
		}
	}
	var walks []string
	for _, impl := range []string{implOurs, implUpstream} {
		if !walked {
			break
		}
		var parts []string
		for _, t := range dpTargets {
			var v []float64
			for _, r := range g.Runs {
				if p := r.phase(impl, modeConfig); p != nil {
					if d, ok := p.DataPlane[t]; ok {
						v = append(v, float64(d.RulesWalked))
					}
				}
			}
			if len(v) > 0 {
				parts = append(parts, fmt.Sprintf("%s %s", t, formatSpread(spreadOf(v), unitCount)))
			}
		}
		if len(parts) > 0 {
			walks = append(walks, impl+": "+strings.Join(parts, ", "))
		}
	}
	if len(walks) > 0 {
		notes = append(notes, "nat rules a new connection walks before its KUBE-SVC chain — "+strings.Join(walks, "; "))
	}
	if len(notes) == 0 {
		return ""
	}
	return "\nNotes:\n- " + strings.Join(notes, "\n- ") + "\n"
}

// section is one generated section of BENCHMARKS.md: one size of one proxy mode.
type section struct {
	begin, end, text string
	proxy            string
}

// sections renders every size measured, mode iptables first.
func sections(results []RunResult, o options, m machineInfo) []section {
	var out []section
	for _, proxy := range []string{proxyIPTables, proxyNFTables} {
		var only []RunResult
		for i := range results {
			if r, ok := results[i].only(proxy); ok {
				only = append(only, r)
			}
		}
		for _, g := range groups(only) {
			sec := section{begin: beginMarker(g.N, g.M), end: endMarker(g.N, g.M), proxy: proxy}
			if proxy == proxyNFTables {
				sec.begin, sec.end = nftBeginMarker(g.N, g.M), nftEndMarker(g.N, g.M)
				sec.text = renderNFTGroup(g, o, m)
			} else {
				sec.text = renderGroup(g, o, m)
			}
			out = append(out, sec)
		}
	}
	return out
}

// renderReport renders every size measured.
func renderReport(results []RunResult, o options, m machineInfo) string {
	var b strings.Builder
	for _, sec := range sections(results, o, m) {
		b.WriteString(sec.text)
		b.WriteString("\n")
	}
	return b.String()
}

// Markers around each generated section of BENCHMARKS.md; everything outside them is left alone.
func beginMarker(n, m int) string { return fmt.Sprintf("<!-- bench:begin N=%d M=%d -->", n, m) }
func endMarker(n, m int) string   { return fmt.Sprintf("<!-- bench:end N=%d M=%d -->", n, m) }

// The markers of mode nftables' sections.
func nftBeginMarker(n, m int) string {
	return fmt.Sprintf("<!-- bench:begin mode=nftables N=%d M=%d -->", n, m)
}
func nftEndMarker(n, m int) string {
	return fmt.Sprintf("<!-- bench:end mode=nftables N=%d M=%d -->", n, m)
}

// updateBenchmarks returns doc with the sections of the measured sizes replaced; a new one goes after
// the last section of its proxy mode, or at the end.
func updateBenchmarks(doc string, results []RunResult, o options, m machineInfo) string {
	for _, sec := range sections(results, o, m) {
		text := sec.begin + "\n" + sec.text + sec.end
		i, j := strings.Index(doc, sec.begin), strings.Index(doc, sec.end)
		if i >= 0 && j > i {
			doc = doc[:i] + text + doc[j+len(sec.end):]
			continue
		}
		endPrefix := "<!-- bench:end N="
		if sec.proxy == proxyNFTables {
			endPrefix = "<!-- bench:end mode=nftables N="
		}
		if k := strings.LastIndex(doc, endPrefix); k >= 0 {
			k += strings.Index(doc[k:], "-->") + len("-->")
			doc = doc[:k] + "\n\n" + text + doc[k:]
			continue
		}
		if !strings.HasSuffix(doc, "\n") {
			doc += "\n"
		}
		doc += "\n" + text + "\n"
	}
	return doc
}

// writeBenchmarks updates path (creating it if needed) with the results.
func writeBenchmarks(path string, results []RunResult, o options, m machineInfo) error {
	doc := "# Benchmarks\n\nWritten by `make bench` (e2e/bench).\n"
	if b, err := os.ReadFile(path); err == nil {
		doc = string(b)
	} else if !os.IsNotExist(err) {
		return err
	}
	return os.WriteFile(path, []byte(updateBenchmarks(doc, results, o, m)), 0o644)
}

// savedRun is the content of results.json.
type savedRun struct {
	Options options
	Machine machineInfo
	Results []RunResult
}

// report prints, and writes to o.Output, the report of the results.json named by o.From, with the
// options and machine recorded there.
func report(_ context.Context, o options) error {
	b, err := os.ReadFile(o.From)
	if err != nil {
		return err
	}
	var saved savedRun
	if err := json.Unmarshal(b, &saved); err != nil {
		return fmt.Errorf("reading %s: %w", o.From, err)
	}
	fmt.Print(renderReport(saved.Results, saved.Options, saved.Machine))
	if o.Output == "" {
		return nil
	}
	return writeBenchmarks(o.Output, saved.Results, saved.Options, saved.Machine)
}
