package main

import (
	"strings"
	"testing"
	"time"
)

func sampleResults() []RunResult {
	ms := func(v int) time.Duration { return time.Duration(v) * time.Millisecond }
	phase := func(impl, mode string, cold, lat int) PhaseResult {
		p := PhaseResult{Impl: impl, Mode: mode, Cold: ms(cold), ColdCommits: 3, Changes: 2,
			Latencies: []time.Duration{ms(lat), ms(2 * lat)}, LoopCPU: cpuTimes{Self: ms(10), Children: ms(30)},
			MemCold: memory{RSS: 40 << 20, HWM: 50 << 20}, MemAfter: memory{RSS: 42 << 20, HWM: 50 << 20},
			RulesPerChange: []int{10, 12}, CommitsPerChange: []int{1, 1}}
		if mode == modeConfig {
			p.DataPlane = map[string]DataPlaneResult{dpLast: {P50: 20 * time.Microsecond, Samples: 10, RulesWalked: 5}}
		}
		return p
	}
	var out []RunResult
	for run, f := range []int{1, 3} {
		out = append(out, RunResult{N: 1000, M: 3, Run: run + 1, Phases: []PhaseResult{
			phase(implOurs, modeConfig, 300*f, 10), phase(implOurs, modeFlags, 300*f, 5),
			phase(implUpstream, modeConfig, 1000*f, 20), phase(implUpstream, modeFlags, 1000*f, 50),
		}, Floors: Floors{Change: map[string][]FloorSample{implOurs: {{Commit: ms(4), Wall: ms(14)}}}}})
	}
	return out
}

func TestRenderGroup(t *testing.T) {
	g := groups(sampleResults())
	if len(g) != 1 || len(g[0].Runs) != 2 {
		t.Fatalf("groups: %+v", g)
	}
	out := renderGroup(g[0], options{Command: "go run ./e2e/bench -n 1000", Changes: 2}, machineInfo{})
	for _, want := range []string{
		"### 1,000 Services × 3 endpoints",
		"| cold start: exec → every Service's rules in the kernel (config file) | 600 ms (300 ms–900 ms) | 2.00 s (1.00 s–3.00 s) | 0.3× |",
		"| network programming p50, minSyncPeriod 0 | 5.0 ms | 50 ms | 0.1× |",
		"| CPU per change, minSyncPeriod 0 (daemon + children) | 20 ms | 20 ms | 1× |",
		"| RSS after the cold sync | 40 MiB | 40 MiB | 1× |",
		"| new connection p50: last-created Service | 20 µs | 20 µs | 1× |",
		"| one Service's own lines for an endpoint change (KUBE-SVC + one KUBE-SEP), ours' shapes over ours' rules | 4.0 ms | 14 ms |",
		"| network programming p50 at minSyncPeriod 0 ÷ one-change restore over ours' rules | 1.25× |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
}

func TestUpdateBenchmarks(t *testing.T) {
	res := sampleResults()
	doc := "# Benchmarks\n\nhand-written notes\n"
	once := updateBenchmarks(doc, res, options{}, machineInfo{})
	if !strings.HasPrefix(once, doc) || !strings.Contains(once, beginMarker(1000, 3)) || !strings.Contains(once, endMarker(1000, 3)) {
		t.Fatalf("first update:\n%s", once)
	}
	// A second run replaces its section instead of adding one, and keeps the text around it.
	twice := updateBenchmarks(once+"\ntrailing notes\n", res, options{}, machineInfo{})
	if strings.Count(twice, beginMarker(1000, 3)) != 1 || !strings.Contains(twice, "trailing notes") || !strings.HasPrefix(twice, doc) {
		t.Errorf("second update:\n%s", twice)
	}
}

// sampleNFTResults adds mode nftables to sampleResults: ours faster than upstream and than the nft -f
// floor, as much memory, connections twice the no-rules floor; upstream's first cold start capped.
func sampleNFTResults() []RunResult {
	ms := func(v int) time.Duration { return time.Duration(v) * time.Millisecond }
	out := sampleResults()
	for i := range out {
		var nft []PhaseResult
		for _, p := range out[i].Phases {
			p.Proxy = proxyNFTables
			p.Cold /= 3
			if p.Impl == implOurs {
				p.Cold /= 10
			}
			p.ElemsPerChange = []int{4, 2}
			if p.Mode == modeConfig {
				p.DataPlane = map[string]DataPlaneResult{dpLast: {P50: 20 * time.Microsecond, Samples: 10},
					dpBare: {P50: 10 * time.Microsecond, Samples: 10}}
			}
			if i == 0 && p.Impl == implUpstream && p.Mode == modeConfig {
				p.ColdCapped, p.ColdProgress = true, 0
			}
			nft = append(nft, p)
		}
		out[i].Phases = append(out[i].Phases, nft...)
		out[i].NFTFloors = &NFTFloors{Source: implOurs, Whole: FloorSample{Commit: ms(200), Wall: ms(210)},
			Change: []FloorSample{{Commit: ms(4), Wall: ms(14)}}}
	}
	return out
}

func TestRenderNFTGroup(t *testing.T) {
	res := sampleNFTResults()
	out := renderReport(res, options{Command: "go run ./e2e/bench", Changes: 2}, machineInfo{NFT: "nftables v1.0.6"})
	ipt, nft, ok := strings.Cut(out, "### Mode nftables: 1,000 Services × 3 endpoints")
	if !ok {
		t.Fatalf("no section of mode nftables in:\n%s", out)
	}
	// Mode iptables' section is the one sampleResults alone renders.
	if want := renderReport(sampleResults(), options{Command: "go run ./e2e/bench", Changes: 2}, machineInfo{NFT: "nftables v1.0.6"}); ipt != want {
		t.Errorf("the iptables section changed:\n%s\nwant:\n%s", ipt, want)
	}
	for _, want := range []string{
		"nftables v1.0.6",
		"| cold start ≤ 0.2× upstream (config file) | 20 ms (10 ms–30 ms) vs 667 ms (333 ms–1.00 s): 0.03× | met (upstream did not finish: the ratio is an upper bound) |",
		"| network programming p50 at minSyncPeriod 0 ≤ 0.3× upstream | 5.0 ms vs 50 ms: 0.10× | met |",
		"| … and ≤ 1.5× a bare `nft -f` of the same change over the same table (both to the commit) | 5.0 ms vs 4.0 ms: 1.25× | met |",
		"| RSS after the cold sync ≤ 0.5× upstream | 40 MiB vs 40 MiB: 1.00× | **not met** |",
		"| new connection to the last-created Service ≤ 1.3× one through a node with no rules (in the same rounds) | 20 µs vs 10 µs: 2.00× | **not met** |",
		"| cold start: exec → every Service's map element and DNAT in the kernel (config file) | 20 ms (10 ms–30 ms) | 667 ms (333 ms–1.00 s) (unfinished: cap) | 0.03× |",
		"| set and map elements added + deleted in the kernel per change (median) | 2 | 2 | 1× |",
		"| the table ours listed after its cold sync, loaded into an empty namespace (one transaction) | 200 ms | 210 ms |",
		"| last-created Service | 2.00× | 2.00× |",
		"run 1, upstream, config file, minSyncPeriod 1s: the cold start had not finished after 333 ms (the cap)",
	} {
		if !strings.Contains(nft, want) {
			t.Errorf("missing %q in:\n%s", want, nft)
		}
	}
	if strings.Contains(nft, "KUBE-SERVICES") || strings.Contains(nft, dpDeepest) {
		t.Errorf("iptables-only rows in mode nftables:\n%s", nft)
	}
}

func TestUpdateBenchmarksNFT(t *testing.T) {
	res := sampleNFTResults()
	doc := "# Benchmarks\n\n" + beginMarker(1000, 3) + "\nold\n" + endMarker(1000, 3) + "\n\n## Mode nftables\n\nprose\n"
	once := updateBenchmarks(doc, res, options{}, machineInfo{})
	i, j := strings.Index(once, nftBeginMarker(1000, 3)), strings.Index(once, nftEndMarker(1000, 3))
	if i < 0 || j < i || strings.Contains(once, "\nold\n") || !strings.Contains(once, "prose") {
		t.Fatalf("first update:\n%s", once)
	}
	// A size not there yet goes after the last section of its mode, before what follows it.
	res[0].N, res[1].N = 5000, 5000
	twice := updateBenchmarks(once+"\ntrailing notes\n", res, options{}, machineInfo{})
	k := strings.Index(twice, nftBeginMarker(5000, 3))
	if k < strings.Index(twice, nftEndMarker(1000, 3)) || k > strings.Index(twice, "trailing notes") ||
		strings.Count(twice, nftBeginMarker(1000, 3)) != 1 || strings.Index(twice, beginMarker(5000, 3)) > strings.Index(twice, "## Mode nftables") {
		t.Errorf("second update:\n%s", twice)
	}
}
