package systemd

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"k8s.io/klog/v2"
)

// TestJournalPriorities runs this test binary again with stderr going to a file that JOURNAL_STREAM names,
// as systemd sets it up, and checks that each klog line carries its syslog priority exactly once.
func TestJournalPriorities(t *testing.T) {
	if os.Getenv("KP_LOG_CHILD") == "1" {
		fs := flag.NewFlagSet("klog", flag.ContinueOnError)
		klog.InitFlags(fs)
		if !UseJournalPriorities(fs) {
			fmt.Println("not switched")
			os.Exit(3)
		}
		klog.InfoS("hello")
		klog.ErrorS(nil, "broken")
		klog.Warning("careful")
		klog.Flush()
		os.Exit(0)
	}
	path := filepath.Join(t.TempDir(), "stderr")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestJournalPriorities$")
	cmd.Env = append(os.Environ(), "KP_LOG_CHILD=1", fmt.Sprintf("JOURNAL_STREAM=%d:%d", st.Dev, st.Ino))
	cmd.Stderr = f
	if out, err := cmd.Output(); err != nil {
		t.Fatalf("child: %v %s", err, out)
	}
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	want := []string{"<6>I", "<3>E", "<4>W"}
	if len(lines) != len(want) {
		t.Fatalf("got %d lines, want %d:\n%s", len(lines), len(want), b)
	}
	for i, l := range lines {
		if !strings.HasPrefix(l, want[i]) {
			t.Errorf("line %d = %q, want prefix %q", i, l, want[i])
		}
	}
}

func TestNoJournalNoSwitch(t *testing.T) {
	t.Setenv("JOURNAL_STREAM", "")
	if UseJournalPriorities(flag.NewFlagSet("x", flag.ContinueOnError)) {
		t.Fatal("switched without JOURNAL_STREAM")
	}
}
