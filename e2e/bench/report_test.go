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
