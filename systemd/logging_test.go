package systemd

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/klog/v2"

	"kube-proxy/config"
)

// Logging changes klog's process-wide state, so each test runs its scenario in a child process (this
// test binary again, told by KP_LOG_CHILD what to do) whose stdout and stderr are files the parent reads.

// childScenarios are the scenarios a child can run; each gets the child's Logging, started by the
// scenario itself.
var childScenarios = map[string]func(l *Logging) error{}

// TestMain runs a child's scenario instead of the tests when KP_LOG_CHILD names one.
func TestMain(m *testing.M) {
	name := os.Getenv("KP_LOG_CHILD")
	if name == "" {
		os.Exit(m.Run())
	}
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	run, ok := childScenarios[name]
	if !ok {
		fmt.Fprintln(os.Stdout, "CHILD-ERROR unknown scenario", name)
		os.Exit(3)
	}
	err := run(NewLogging(fs))
	klog.Flush()
	if err != nil {
		fmt.Fprintln(os.Stdout, "CHILD-ERROR", err)
		os.Exit(3)
	}
	os.Exit(0)
}

// runChild runs scenario in a child with stdout and stderr in files, plus env, and returns both outputs.
// journal makes JOURNAL_STREAM name the child's stderr file, as systemd does for a unit's output.
func runChild(t *testing.T, scenario string, journal bool, env ...string) (stdout, stderr string) {
	t.Helper()
	dir := t.TempDir()
	outPath, errPath := filepath.Join(dir, "stdout"), filepath.Join(dir, "stderr")
	out, err := os.Create(outPath)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	errF, err := os.Create(errPath)
	if err != nil {
		t.Fatal(err)
	}
	defer errF.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "KP_LOG_CHILD="+scenario, "KP_LOG_STDOUT="+outPath)
	cmd.Env = append(cmd.Env, env...)
	if journal {
		var st syscall.Stat_t
		if err := syscall.Fstat(int(errF.Fd()), &st); err != nil {
			t.Fatal(err)
		}
		cmd.Env = append(cmd.Env, fmt.Sprintf("JOURNAL_STREAM=%d:%d", st.Dev, st.Ino))
	} else {
		cmd.Env = append(cmd.Env, "JOURNAL_STREAM=")
	}
	cmd.Stdout, cmd.Stderr = out, errF
	runErr := cmd.Run()
	o, _ := os.ReadFile(outPath)
	e, _ := os.ReadFile(errPath)
	if runErr != nil {
		t.Fatalf("child %s: %v\nstdout:\n%s\nstderr:\n%s", scenario, runErr, o, e)
	}
	return string(o), string(e)
}

func textConfig() config.LoggingConfiguration {
	return config.Default().Logging
}

func lines(s string) []string {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

func init() {
	childScenarios["journal"] = func(l *Logging) error {
		if err := l.Start(textConfig(), true); err != nil {
			return err
		}
		klog.InfoS("hello")
		klog.ErrorS(nil, "broken")
		klog.Warning("careful")
		return nil
	}
}

// TestJournalPriorities: with stderr the journal, each klog line carries its syslog priority exactly once.
func TestJournalPriorities(t *testing.T) {
	_, stderr := runChild(t, "journal", true)
	got := lines(stderr)
	want := []string{"<6>I", "<3>E", "<4>W"}
	if len(got) != len(want) {
		t.Fatalf("got %d lines, want %d:\n%s", len(got), len(want), stderr)
	}
	for i, l := range got {
		if !strings.HasPrefix(l, want[i]) {
			t.Errorf("line %d = %q, want prefix %q", i, l, want[i])
		}
	}
}

func TestNoJournalNoPriorities(t *testing.T) {
	_, stderr := runChild(t, "journal", false)
	for _, l := range lines(stderr) {
		if strings.HasPrefix(l, "<") {
			t.Errorf("priority prefix without a journal: %q", l)
		}
	}
	if n := len(lines(stderr)); n != 3 {
		t.Errorf("got %d lines on stderr, want 3:\n%s", n, stderr)
	}
}

func init() {
	childScenarios["split-text"] = func(l *Logging) error {
		c := textConfig()
		c.Options.Text.SplitStream = true
		if err := l.Start(c, true); err != nil {
			return err
		}
		klog.InfoS("to stdout")
		klog.Infof("printf to stdout")
		klog.ErrorS(nil, "to stderr")
		klog.Warning("warning to stderr")
		return nil
	}
}

// TestSplitStreamText: logging.options.text.splitStream sends info to stdout and the rest to stderr, as
// upstream's text format does.
func TestSplitStreamText(t *testing.T) {
	stdout, stderr := runChild(t, "split-text", false)
	out, errs := lines(stdout), lines(stderr)
	if len(out) != 2 || !strings.HasPrefix(out[0], "I") || !strings.Contains(out[0], `"to stdout"`) || !strings.Contains(out[1], "printf to stdout") {
		t.Errorf("stdout:\n%s", stdout)
	}
	if len(errs) != 2 || !strings.HasPrefix(errs[0], "E") || !strings.HasPrefix(errs[1], "W") {
		t.Errorf("stderr:\n%s", stderr)
	}
}

func init() {
	// The info stream is buffered and flushFrequency starts at an hour: nothing reaches stdout until
	// Apply lowers it, then the flush daemon writes it out.
	childScenarios["buffer-flush"] = func(l *Logging) error {
		c := textConfig()
		c.Options.Text.SplitStream = true
		c.Options.Text.InfoBufferSize = resource.QuantityValue{Quantity: resource.MustParse("64Ki")}
		c.FlushFrequency.Duration.Duration = time.Hour
		if err := l.Start(c, true); err != nil {
			return err
		}
		klog.InfoS("buffered")
		time.Sleep(300 * time.Millisecond)
		path := os.Getenv("KP_LOG_STDOUT")
		if b, _ := os.ReadFile(path); len(b) != 0 {
			return fmt.Errorf("info reached stdout before a flush: %q", b)
		}
		c.FlushFrequency.Duration.Duration = 50 * time.Millisecond
		if err := l.Apply(c); err != nil {
			return err
		}
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if b, _ := os.ReadFile(path); bytes.Contains(b, []byte(`"buffered"`)) {
				return nil
			}
		}
		return fmt.Errorf("the buffered line was not flushed within 5s of flushFrequency 50ms")
	}
}

// TestFlushFrequencyLive: logging.options.text.infoBufferSize buffers the info stream, and a new
// logging.flushFrequency, applied while running, is the interval at which it is written out.
func TestFlushFrequencyLive(t *testing.T) {
	stdout, _ := runChild(t, "buffer-flush", false)
	if strings.Contains(stdout, "CHILD-ERROR") {
		t.Fatal(stdout)
	}
}

func init() {
	childScenarios["verbosity-vmodule"] = func(l *Logging) error {
		c := textConfig()
		if err := l.Start(c, true); err != nil {
			return err
		}
		klog.V(3).InfoS("hidden: v0")
		c.VModule = config.VModuleConfiguration{{FilePattern: "logging_test", Verbosity: 3}}
		if err := l.Apply(c); err != nil {
			return err
		}
		klog.V(3).InfoS("shown: vmodule")
		klog.V(4).InfoS("hidden: above vmodule")
		klog.Background().V(3).Info("shown: vmodule, contextual")
		c.VModule = nil
		if err := l.Apply(c); err != nil {
			return err
		}
		klog.V(3).InfoS("hidden: vmodule removed")
		c.Verbosity = 4
		if err := l.Apply(c); err != nil {
			return err
		}
		klog.V(4).InfoS("shown: verbosity 4")
		if err := l.SetVerbosity(1); err != nil {
			return err
		}
		klog.V(2).InfoS("hidden: verbosity 1")
		klog.V(1).InfoS("shown: verbosity 1")
		return nil
	}
}

// TestVerbosityAndVModuleLive: logging.verbosity and logging.vmodule take effect at once when applied to
// a running daemon, through klog's calls and the contextual logger alike.
func TestVerbosityAndVModuleLive(t *testing.T) {
	_, stderr := runChild(t, "verbosity-vmodule", false)
	var shown []string
	for _, l := range lines(stderr) {
		_, msg, _ := strings.Cut(l, "] ")
		shown = append(shown, msg)
	}
	want := []string{`"shown: vmodule"`, `"shown: vmodule, contextual"`, `"shown: verbosity 4"`, `"shown: verbosity 1"`}
	if !slices.Equal(shown, want) {
		t.Errorf("logged %q, want %q", shown, want)
	}
}

func init() {
	childScenarios["json"] = func(l *Logging) error {
		c := textConfig()
		c.Format = "json"
		if os.Getenv("KP_LOG_SPLIT") != "" {
			c.Options.JSON.SplitStream = true
		}
		if err := l.Start(c, true); err != nil {
			return err
		}
		klog.V(2).InfoS("hidden")
		if err := l.SetVerbosity(2); err != nil {
			return err
		}
		klog.V(2).InfoS("info", "key", "value")
		klog.ErrorS(fmt.Errorf("boom"), "error")
		return nil
	}
}

// TestJSONFormat: logging.format json writes upstream's JSON lines (component-base's format: ts, caller,
// msg, v, err), on stderr or, with splitStream, info on stdout; verbosity changes apply to it.
func TestJSONFormat(t *testing.T) {
	check := func(t *testing.T, out string, wantMsgs ...string) {
		t.Helper()
		got := lines(out)
		if len(got) != len(wantMsgs) {
			t.Fatalf("got %d lines, want %d:\n%s", len(got), len(wantMsgs), out)
		}
		for i, l := range got {
			var m map[string]any
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Fatalf("line %d is not JSON: %q", i, l)
			}
			if m["msg"] != wantMsgs[i] || m["ts"] == nil || m["caller"] == nil {
				t.Errorf("line %d = %q, want msg %q with ts and caller", i, l, wantMsgs[i])
			}
			if m["msg"] == "info" && (m["v"] != float64(2) || m["key"] != "value") {
				t.Errorf("info line %q: want v 2 and key value", l)
			}
			if m["msg"] == "error" && m["err"] != "boom" {
				t.Errorf("error line %q: want err boom", l)
			}
		}
	}
	t.Run("one stream", func(t *testing.T) {
		stdout, stderr := runChild(t, "json", false)
		if stdout != "" {
			t.Errorf("stdout: %q", stdout)
		}
		check(t, stderr, "info", "error")
	})
	t.Run("split", func(t *testing.T) {
		stdout, stderr := runChild(t, "json", false, "KP_LOG_SPLIT=1")
		check(t, stdout, "info")
		check(t, stderr, "error")
	})
	t.Run("journal", func(t *testing.T) {
		_, stderr := runChild(t, "json", true)
		got := lines(stderr)
		if len(got) != 2 || !strings.HasPrefix(got[0], "<6>{") || !strings.HasPrefix(got[1], "<3>{") {
			t.Errorf("want <6> and <3> before the JSON lines:\n%s", stderr)
		}
	})
}

func init() {
	childScenarios["refuse"] = func(l *Logging) error {
		c := textConfig()
		if err := l.Apply(c); err == nil {
			return fmt.Errorf("Apply before Start succeeded")
		}
		if err := l.Start(c, true); err != nil {
			return err
		}
		if err := l.Start(c, true); err == nil {
			return fmt.Errorf("a second Start succeeded")
		}
		other := c
		other.Format = "json"
		if err := l.Apply(other); err == nil || !strings.Contains(err.Error(), "logging.format: changing text to json needs a restart") {
			return fmt.Errorf("format change: %v", err)
		}
		other = c
		other.Options.Text.SplitStream = true
		other.Verbosity = 5
		if err := l.Apply(other); err == nil || !strings.Contains(err.Error(), "logging.options.text: changing the output streams needs a restart") {
			return fmt.Errorf("options change: %v", err)
		}
		if klog.V(5).Enabled() {
			return fmt.Errorf("a refused Apply changed the verbosity")
		}
		return nil
	}
}

// TestApplyRefusesRestartFields: Apply changes nothing when the format or the output streams differ.
func TestApplyRefusesRestartFields(t *testing.T) {
	stdout, _ := runChild(t, "refuse", false)
	if strings.Contains(stdout, "CHILD-ERROR") {
		t.Fatal(stdout)
	}
}

// TestLiveLoggingFieldsMatchReloadPlan: the logging fields config.ReloadPlan calls live are exactly
// those Apply puts in force (the tests above show each one acting), so a reload never reports a logging
// field as applied when nothing applied it.
func TestLiveLoggingFieldsMatchReloadPlan(t *testing.T) {
	changes := map[string]func(c *config.LoggingConfiguration){
		"logging.format":         func(c *config.LoggingConfiguration) { c.Format = "json" },
		"logging.flushFrequency": func(c *config.LoggingConfiguration) { c.FlushFrequency.Duration.Duration = time.Second },
		"logging.verbosity":      func(c *config.LoggingConfiguration) { c.Verbosity = 4 },
		"logging.vmodule": func(c *config.LoggingConfiguration) {
			c.VModule = config.VModuleConfiguration{{FilePattern: "x", Verbosity: 2}}
		},
		"logging.options.text.splitStream": func(c *config.LoggingConfiguration) { c.Options.Text.SplitStream = true },
		"logging.options.text.infoBufferSize": func(c *config.LoggingConfiguration) {
			c.Options.Text.InfoBufferSize.Quantity = resource.MustParse("1Ki")
		},
		"logging.options.json.splitStream": func(c *config.LoggingConfiguration) { c.Options.JSON.SplitStream = true },
		"logging.options.json.infoBufferSize": func(c *config.LoggingConfiguration) {
			c.Options.JSON.InfoBufferSize.Quantity = resource.MustParse("1Ki")
		},
	}
	var live []string
	for field, change := range changes {
		old, next := config.Default(), config.Default()
		change(&next.Logging)
		l, r := config.ReloadPlan(old, next)
		if len(l)+len(r) != 1 || slices.Concat(l, r)[0] != field {
			t.Errorf("changing %s: ReloadPlan = %v, %v", field, l, r)
		}
		live = append(live, l...)
	}
	slices.Sort(live)
	want := slices.Sorted(slices.Values(liveLoggingFields))
	if !slices.Equal(live, want) {
		t.Errorf("ReloadPlan's live logging fields = %v, Logging.Apply's = %v", live, want)
	}
}
