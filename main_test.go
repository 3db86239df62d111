package main

import (
	"strings"
	"testing"

	"kube-proxy/config"
)

// TestVersion: --version prints upstream's line first, exactly, for the scripts that parse it
// (`kube-proxy --version | awk '{print $2}'`), then this build's version and commit.
func TestVersion(t *testing.T) {
	opts := config.NewOptions()
	fs, _ := newFlagSet(opts)
	if err := fs.Parse([]string{"--version"}); err != nil {
		t.Fatal(err)
	}
	if !opts.Version {
		t.Fatal("--version was not taken")
	}
	var out strings.Builder
	printVersion(&out)
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("--version printed %q, want two lines", out.String())
	}
	if lines[0] != "Kubernetes v1.37.2" {
		t.Errorf("first line %q, want upstream's %q", lines[0], "Kubernetes v1.37.2")
	}
	if want := "kube-proxy " + version + " (commit " + commit + ")"; lines[1] != want {
		t.Errorf("second line %q, want %q", lines[1], want)
	}
}

// TestFlagSet: main's command line takes upstream's deprecated port flags (as config.Options does) and
// klog's -v and --vmodule, and no other klog flag.
func TestFlagSet(t *testing.T) {
	opts := config.NewOptions()
	fs, _ := newFlagSet(opts)
	if err := fs.Parse([]string{"--healthz-port=0", "--metrics-port=10249", "-v=2", "--vmodule=proxy=4"}); err != nil {
		t.Fatalf("upstream's flags refused: %v", err)
	}
	for _, name := range []string{"logtostderr", "log_file", "alsologtostderr"} {
		if fs.Lookup(name) != nil {
			t.Errorf("klog's --%s is on the command line", name)
		}
	}
}
