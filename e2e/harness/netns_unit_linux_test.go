package harness

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

func TestCreatorPID(t *testing.T) {
	tests := []struct {
		name string
		pid  int
		ok   bool
	}{
		{"kpt-node-1234-a1b2c3", 1234, true},
		{"kpt-my-label-77-ffffff", 77, true},
		{"kpt-node-x-a1b2c3", 0, false},
		{"other-node-1234-a1b2c3", 0, false},
		{"kpt-1234", 0, false},
	}
	for _, tt := range tests {
		pid, ok := creatorPID(tt.name)
		if pid != tt.pid || ok != tt.ok {
			t.Errorf("creatorPID(%q) = %d, %v; want %d, %v", tt.name, pid, ok, tt.pid, tt.ok)
		}
	}
}

// fakeTB records Skip and Fatal calls and stops the calling function like testing does.
type fakeTB struct {
	testing.TB
	skipped, fatal string
}

type stop struct{}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Skipf(format string, args ...any) {
	f.skipped = fmt.Sprintf(format, args...)
	panic(stop{})
}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.fatal = fmt.Sprintf(format, args...)
	panic(stop{})
}

func runRequire(tools ...string) (f *fakeTB) {
	f = &fakeTB{}
	defer func() {
		if r := recover(); r != nil && r != (stop{}) {
			panic(r)
		}
	}()
	Require(f, tools...)
	return f
}

func TestRequire(t *testing.T) {
	tests := []struct {
		env       string
		tools     []string
		wantSkip  bool
		wantFatal string
	}{
		{env: "", wantSkip: true},
		{env: "0", wantSkip: true},
		{env: "1", tools: []string{"kpt-no-such-tool"}, wantFatal: `command "kpt-no-such-tool"`},
	}
	if os.Geteuid() != 0 {
		tests = append(tests, struct {
			env       string
			tools     []string
			wantSkip  bool
			wantFatal string
		}{env: "1", wantFatal: "root"})
	}
	for _, tt := range tests {
		t.Run("KP_E2E="+tt.env, func(t *testing.T) {
			t.Setenv(EnvE2E, tt.env)
			f := runRequire(tt.tools...)
			if (f.skipped != "") != tt.wantSkip {
				t.Errorf("skipped = %q, want skip %v", f.skipped, tt.wantSkip)
			}
			if tt.wantFatal == "" && f.fatal != "" || !strings.Contains(f.fatal, tt.wantFatal) {
				t.Errorf("fatal = %q, want it to contain %q", f.fatal, tt.wantFatal)
			}
		})
	}
}
