package harness

import (
	"bytes"
	"errors"
	"os"
	"os/exec"

	"kube-proxy/e2e/probe"
)

// Process supervises one daemon started by a test: probe.Process (its log in a file, signalled and
// stopped by PID, killed if the test binary dies).
type Process = probe.Process

// NewProcess returns an unstarted Process named name that logs to logPath.
func NewProcess(name, logPath string) *Process { return probe.NewProcess(name, logPath) }

// StartProcess is NewProcess followed by Start.
func StartProcess(name string, cmd *exec.Cmd, logPath string) (*Process, error) {
	return probe.StartProcess(name, cmd, logPath)
}

// logContains reports whether the log file at path contains substr.
func logContains(path, substr string) bool {
	b, err := os.ReadFile(path)
	return err == nil && bytes.Contains(b, []byte(substr))
}

// errProcessExited is returned by waits that end because the process they wait for died.
var errProcessExited = errors.New("process exited")
