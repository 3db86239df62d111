package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"kube-proxy/e2e/conformance/results"
)

func TestParseRuns(t *testing.T) {
	runs, err := parseRuns(defaultRuns)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 7 || runs[0] != (runSpec{implUpstream, "iptables", wayProcess}) {
		t.Errorf("default runs %v", runs)
	}
	for _, bad := range []string{"ours/ipvs/process", "upstream/userspace/process", "ours/iptables/pod",
		"upstream/nftables/daemonset", "theirs/iptables/process", "ours/iptables"} {
		if _, err := parseRuns(bad); err == nil {
			t.Errorf("parseRuns(%q) accepted", bad)
		}
	}
}

// TestDaemonSetManifest applies the lab's edits to the project's manifest: each must still match once,
// and the result must say what the run needs.
func TestDaemonSetManifest(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chdir(filepath.Join(wd, "../..")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Chdir(wd) })
	l := newLab(t.TempDir(), binaries{}, t.Logf)
	path, err := l.daemonSetManifest("nftables")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	for _, want := range []string{"server: " + apiServer, "mode: nftables", "image: " + ourImage, "clusterCIDR: " + clusterCIDR} {
		if !strings.Contains(text, want) {
			t.Errorf("manifest lacks %q", want)
		}
	}
	for _, doc := range strings.Split(text, "\n---\n") {
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Errorf("edited manifest is not YAML: %v\n%s", err, doc)
		}
	}
}

// TestResumeFrom keeps the runs an interrupted invocation completed, gives them the version its meta.json
// recorded, and refuses a directory that chose other tests.
func TestResumeFrom(t *testing.T) {
	dir := t.TempDir()
	old := results.Meta{Focus: "f", Skip: "s", Procs: 2, Versions: map[string]string{"ours": "kube-proxy abc",
		upstreamVersionKey: "Kubernetes v1.37.2"}, Phases: []results.Phase{{Name: "lab up", Seconds: 80}}}
	if err := results.WriteJSON(filepath.Join(dir, "meta.json"), old); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*results.Run{
		{Impl: "upstream", Mode: "iptables", Way: "process"},
		{Impl: "ours", Mode: "iptables", Way: "process", ExitCode: 1}, // tests failed: still complete
		{Impl: "ours", Mode: "nftables", Way: "process", Error: "signal: interrupt"},
	} {
		d := filepath.Join(dir, "runs", r.Name())
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := results.WriteJSON(filepath.Join(d, "run.json"), r); err != nil {
			t.Fatal(err)
		}
	}
	meta := &results.Meta{Focus: "f", Skip: "s", Procs: 2}
	kept, err := resumeFrom(dir, meta)
	if err != nil {
		t.Fatal(err)
	}
	if !kept["upstream-iptables-process"] || !kept["ours-iptables-process"] || kept["ours-nftables-process"] || len(kept) != 2 {
		t.Errorf("kept %v, want the two complete runs", kept)
	}
	if len(meta.Phases) != 2 || meta.Phases[0].Name != "lab up" {
		t.Errorf("phases %+v, want the earlier one and a marker", meta.Phases)
	}
	res, err := results.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res.Runs {
		want := map[string]string{"ours-iptables-process": "kube-proxy abc", "upstream-iptables-process": "Kubernetes v1.37.2"}[r.Name()]
		if r.KubeProxy != want {
			t.Errorf("%s: version %q, want %q", r.Name(), r.KubeProxy, want)
		}
	}
	if _, err := resumeFrom(dir, &results.Meta{Focus: "other", Skip: "s", Procs: 2}); err == nil {
		t.Error("resumed from a directory that chose other tests")
	}
	if kept, err := resumeFrom(filepath.Join(dir, "new"), &results.Meta{}); err != nil || len(kept) != 0 {
		t.Errorf("resuming a directory no run wrote: kept %v, err %v; want a first invocation", kept, err)
	}
}
