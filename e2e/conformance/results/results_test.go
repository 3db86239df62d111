package results

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseJUnit(t *testing.T) {
	f, err := os.Open("testdata/junit.xml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cases, err := ParseJUnit(f)
	if err != nil {
		t.Fatal(err)
	}
	want := []Case{
		{Name: "[sig-network] Services should serve a basic endpoint from pods [Conformance]", Status: "passed"},
		{Name: "[sig-network] Services should be able to up and down services [LinuxOnly]", Status: "failed",
			Message: "service is not reachable within 2m0s timeout on endpoint up-down-2:80 over TCP protocol"},
		{Name: "[sig-network] Services should work with the ESIPP on GCE [Feature:X]", Status: "skipped",
			Message: "skipped - Only supported for providers [gce] (not local)"},
		{Name: "[sig-network] Networking Granular Checks: Services should function for pod-Service: http", Status: "passed"},
		{Name: "[sig-storage] unrelated test", Status: "skipped", Message: "skipped"},
	}
	if len(cases) != len(want) {
		t.Fatalf("got %d cases, want %d (the suite nodes are not tests): %+v", len(cases), len(want), cases)
	}
	for i, w := range want {
		c := cases[i]
		if c.Name != w.Name || c.Status != w.Status || c.Message != w.Message {
			t.Errorf("case %d:\n got %+v\nwant %+v", i, c, w)
		}
	}
}

// TestMarkdown renders two runs, ours failing a test upstream passes, and checks what the document
// must say: the counts, the verdict, the failure with upstream's result beside it, the skip reason.
func TestMarkdown(t *testing.T) {
	dir := t.TempDir()
	meta := Meta{Date: time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC), Command: "make conformance",
		Focus: `\[sig-network\] (Services|Networking Granular Checks: Services) `, Skip: `\[Feature:`, Procs: 2,
		Versions: map[string]string{"kernel": "6.18"},
		Phases:   []Phase{{Name: "lab up", Seconds: 42}}}
	if err := WriteJSON(filepath.Join(dir, "meta.json"), meta); err != nil {
		t.Fatal(err)
	}
	junit, err := os.ReadFile("testdata/junit.xml")
	if err != nil {
		t.Fatal(err)
	}
	writeRun(t, dir, &Run{Impl: "ours", Mode: "iptables", Way: "process", ExitCode: 1, KubeProxy: "kube-proxy abc"}, string(junit))
	passing := strings.ReplaceAll(string(junit), `status="failed"`, `status="passed"`)
	writeRun(t, dir, &Run{Impl: "upstream", Mode: "iptables", Way: "process"}, passing)
	writeRun(t, dir, &Run{Impl: "ours", Mode: "nftables", Way: "process", KubeProxy: "kube-proxy def"}, passing)

	res, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if res.Runs[0].Impl != "ours" {
		t.Fatalf("runs not ordered ours first: %s", res.Runs[0].Name())
	}
	md, err := Markdown(res, "go run ./e2e/conformance/report")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| Services | 1 / 1 / 0 | 2 / 0 / 0 | 2 / 0 / 0 |",
		"| Networking Granular Checks: Services | 1 / 0 / 0 | 1 / 0 / 0 | 1 / 0 / 0 |",
		"| of which `[Conformance]` | 1 / 0 / 0 | 1 / 0 / 0 | 1 / 0 / 0 |",
		"ours iptables (process): kube-proxy abc; ours nftables (process): kube-proxy def",
		"ours iptables (process): passes 2 of the 3 tests upstream passes; not: `[sig-network] Services should be able to up and down services [LinuxOnly]`",
		"ours iptables (process): service is not reachable within 2m0s timeout on endpoint up-down-2:80 over TCP protocol Upstream passes it on the same bed.",
		"| [sig-network] Services should be able to up and down services [LinuxOnly] | ✗ | ✓ | ✓ |",
		"| lab up | 42 |  |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("document lacks %q:\n%s", want, md)
		}
	}
	// Unselected tests (another SIG; a [Feature:] test the skip pattern leaves out) are not counted.
	for _, unwanted := range []string{"sig-storage", "ESIPP"} {
		if strings.Contains(md, unwanted) {
			t.Errorf("document mentions %q, which the selection leaves out", unwanted)
		}
	}
}

func writeRun(t *testing.T, dir string, r *Run, junit string) {
	t.Helper()
	d := filepath.Join(dir, "runs", r.Name())
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := WriteJSON(filepath.Join(d, "run.json"), r); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "junit.xml"), []byte(junit), 0o644); err != nil {
		t.Fatal(err)
	}
}
