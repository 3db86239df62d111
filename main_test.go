package main

import (
	"strings"
	"testing"

	"kube-proxy/config"
)

// TestVersion: --version prints upstream's line first, exactly, for the scripts that parse it
// (`kube-proxy --version | awk '{print $2}'`), then this build's version and commit; --version=raw prints
// upstream's version.Info as a Go value instead of the first line; --version=vX.Y.Z prints nothing and
// sets the release reported.
func TestVersion(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		print   bool
		release string
		first   string // the first line printed, or its prefix with raw
	}{
		{args: []string{"--version"}, print: true, release: "v1.37.2", first: "Kubernetes v1.37.2"},
		{args: []string{"--version=true"}, print: true, release: "v1.37.2", first: "Kubernetes v1.37.2"},
		{args: []string{"--version=false"}, release: "v1.37.2"},
		{args: []string{"--version=raw"}, print: true, release: "v1.37.2",
			first: `version.Info{Major:"1", Minor:"37", EmulationMajor:"", EmulationMinor:"", MinCompatibilityMajor:"", MinCompatibilityMinor:"", GitVersion:"v1.37.2", GitCommit:"`},
		{args: []string{"--version=v1.37.2-custom.1"}, release: "v1.37.2-custom.1"},
		{args: nil, release: "v1.37.2"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			opts := config.NewOptions()
			fs, _ := newFlagSet(opts)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			print, raw := opts.Version.Print()
			if print != tc.print || opts.Version.Release() != tc.release {
				t.Fatalf("print %t release %q, want %t %q", print, opts.Version.Release(), tc.print, tc.release)
			}
			if !print {
				return
			}
			var out strings.Builder
			printVersion(&out, opts.Version.Release(), raw)
			lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
			if len(lines) != 2 {
				t.Fatalf("--version printed %q, want two lines", out.String())
			}
			if raw && !strings.HasPrefix(lines[0], tc.first) || !raw && lines[0] != tc.first {
				t.Errorf("first line %q, want %q", lines[0], tc.first)
			}
			if want := "kube-proxy " + version + " (commit " + commit + ")"; lines[1] != want {
				t.Errorf("second line %q, want %q", lines[1], want)
			}
		})
	}
	for _, bad := range []string{"--version=v1.38.0", "--version=v1.37", "--version=vnext", "--version=maybe"} {
		opts := config.NewOptions()
		fs, _ := newFlagSet(opts)
		if err := fs.Parse([]string{bad}); err == nil {
			t.Errorf("%s was accepted", bad)
		}
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
