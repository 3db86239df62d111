package probe

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Process supervises one daemon started by a test or by the IPVS VM's guest: its stdout and stderr go
// to a log file, it is signalled and stopped by PID (through os.Process, which holds a pidfd, so a
// recycled PID is never hit), and unless its command says otherwise it is killed if its starter dies
// (SIGKILL as parent-death signal; see Start).
type Process struct {
	// Name labels the process in errors.
	Name string
	// LogPath is the file stdout and stderr are appended to.
	LogPath string
	// Echo, when set, gets stdout and stderr too (a console, say).
	Echo io.Writer

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{}
	waitErr error
}

// NewProcess returns an unstarted Process named name that logs to logPath.
func NewProcess(name, logPath string) *Process {
	return &Process{Name: name, LogPath: logPath}
}

// StartProcess is NewProcess followed by Start.
func StartProcess(name string, cmd *exec.Cmd, logPath string) (*Process, error) {
	p := NewProcess(name, logPath)
	if err := p.Start(cmd); err != nil {
		return nil, err
	}
	return p, nil
}

// Start starts cmd with stdout and stderr appended to LogPath and copied to Echo (unless cmd already sets
// them) and stdin
// from /dev/null. Unless cmd sets SysProcAttr, the process gets its own process group (so a terminal's
// ^C reaches only the test binary, which then stops it) and SIGKILL as parent-death signal.
// A Process can be started once.
func (p *Process) Start(cmd *exec.Cmd) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return fmt.Errorf("process %s already started", p.Name)
	}
	logf, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("opening log of %s: %w", p.Name, err)
	}
	var out io.Writer = logf
	if p.Echo != nil {
		out = io.MultiWriter(logf, p.Echo)
	}
	if cmd.Stdout == nil {
		cmd.Stdout = out
	}
	if cmd.Stderr == nil {
		cmd.Stderr = out
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	}
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return fmt.Errorf("starting %s: %w", p.Name, err)
	}
	p.cmd = cmd
	p.done = make(chan struct{})
	go func() {
		err := cmd.Wait()
		_ = logf.Close()
		p.mu.Lock()
		p.waitErr = err
		p.mu.Unlock()
		close(p.done)
	}()
	return nil
}

// PID returns the process ID, or 0 before Start.
func (p *Process) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Done returns a channel closed when the process has exited and been reaped (nil before Start).
func (p *Process) Done() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

// Exited reports whether the process was started and has exited.
func (p *Process) Exited() bool {
	done := p.Done()
	if done == nil {
		return false
	}
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// ExitErr returns the result of waiting for the process (nil for exit status 0, an *exec.ExitError
// otherwise); only meaningful once Exited.
func (p *Process) ExitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.waitErr
}

// Wait blocks until the process exits or ctx ends, and returns ExitErr or ctx's error.
func (p *Process) Wait(ctx context.Context) error {
	done := p.Done()
	if done == nil {
		return fmt.Errorf("process %s not started", p.Name)
	}
	select {
	case <-done:
		return p.ExitErr()
	case <-ctx.Done():
		return fmt.Errorf("waiting for %s: %w", p.Name, ctx.Err())
	}
}

// Signal sends sig to the process; it fails if the process is not running.
func (p *Process) Signal(sig os.Signal) error {
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if cmd == nil {
		return fmt.Errorf("process %s not started", p.Name)
	}
	if p.Exited() {
		return fmt.Errorf("process %s already exited: %v", p.Name, p.ExitErr())
	}
	if err := cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signalling %s (pid %d): %w", p.Name, cmd.Process.Pid, err)
	}
	return nil
}

// Stop sends sig and waits up to timeout for the process to exit, then kills it with SIGKILL. It
// returns nil when the process exited on its own (whatever its status: see ExitErr), an error when it
// had to be killed. Stopping a process that never started or already exited does nothing, so Stop is
// idempotent.
func (p *Process) Stop(sig os.Signal, timeout time.Duration) error {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil || p.Exited() {
		return nil
	}
	_ = cmd.Process.Signal(sig) // fails only if it exited meanwhile
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
		return nil
	case <-t.C:
	}
	_ = cmd.Process.Kill()
	<-done
	return fmt.Errorf("%s (pid %d) did not exit within %s of %v; killed", p.Name, cmd.Process.Pid, timeout, sig)
}

// Log returns everything the process wrote to stdout and stderr so far.
func (p *Process) Log() string {
	b, err := os.ReadFile(p.LogPath)
	if err != nil {
		return fmt.Sprintf("(reading log of %s: %v)", p.Name, err)
	}
	return string(b)
}

// LogTail returns the last n lines of Log.
func (p *Process) LogTail(n int) string { return Tail(p.Log(), n) }

// Tail returns the last n lines of s.
func Tail(s string, n int) string {
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > 2*n {
			lines = lines[len(lines)-n:]
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// PrefixLines returns a writer that writes each line written to it to w as "prefix: line", whole lines
// only (for a process's Echo to a console shared with other output).
func PrefixLines(w io.Writer, prefix string) io.Writer { return &prefixLines{w: w, prefix: prefix} }

type prefixLines struct {
	mu      sync.Mutex
	w       io.Writer
	prefix  string
	partial []byte
}

func (p *prefixLines) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.partial = append(p.partial, b...)
	for {
		i := bytes.IndexByte(p.partial, '\n')
		if i < 0 {
			return len(b), nil
		}
		if _, err := fmt.Fprintf(p.w, "%s: %s\n", p.prefix, p.partial[:i]); err != nil {
			return len(b), err
		}
		p.partial = p.partial[i+1:]
	}
}
