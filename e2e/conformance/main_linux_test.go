package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
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
