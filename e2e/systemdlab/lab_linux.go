package systemdlab

import (
	"bytes"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"kube-proxy/e2e/harness"
)

//go:embed rootfs.sh
var rootfsScript []byte

// Suites are the Debian releases the tests boot, with the systemd version each ships.
var Suites = []Suite{
	{Name: "bookworm", Systemd: 252},
	{Name: "trixie", Systemd: 257},
}

// Suite is a Debian release to boot.
type Suite struct {
	// Name is the Debian code name (bookworm, trixie).
	Name string
	// Systemd is the major systemd version it ships.
	Systemd int
}

// EnvCacheDir overrides where root file systems are cached.
const EnvCacheDir = "KP_LAB_CACHE"

// CacheDir returns where root file systems are cached: $KP_LAB_CACHE, or systemd-lab beside the harness's
// cluster binaries (~/.cache/kube-proxy-e2e/systemd-lab). Never inside the repository.
func CacheDir() string {
	if d := os.Getenv(EnvCacheDir); d != "" {
		return d
	}
	return filepath.Join(filepath.Dir(harness.DefaultBinDir()), "systemd-lab")
}

// RootfsDir returns the cached root file system of a suite.
func RootfsDir(suite string) string {
	return filepath.Join(CacheDir(), "rootfs-"+suite)
}

// EnsureRootfs builds the suite's root file system with debootstrap unless it is cached (rootfs.sh: about
// a minute and a half per suite on two cores; a few milliseconds when cached), and returns its directory.
func EnsureRootfs(ctx context.Context, suite string) (string, error) {
	dir := RootfsDir(suite)
	// Run the embedded script from a file, not from stdin, which debootstrap's children would inherit.
	f, err := os.CreateTemp("", "kplab-rootfs-*.sh")
	if err != nil {
		return "", fmt.Errorf("writing rootfs.sh: %w", err)
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(rootfsScript); err != nil {
		f.Close()
		return "", fmt.Errorf("writing rootfs.sh: %w", err)
	}
	if err := f.Close(); err != nil {
		return "", fmt.Errorf("writing rootfs.sh: %w", err)
	}
	cmd := exec.CommandContext(ctx, "bash", f.Name(), suite, dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the %s rootfs: %w: %s", suite, err, strings.TrimSpace(string(out)))
	}
	return dir, nil
}

// BootOptions configure Boot.
type BootOptions struct {
	// Suite is the Debian release (bookworm or trixie); its rootfs must exist (EnsureRootfs).
	Suite string
	// LabDir is a host directory bound read-only at /lab inside the machine.
	LabDir string
	// ConsoleLog is the file the machine's console (and nspawn's messages) go to.
	ConsoleLog string
	// Timeout bounds the boot; default 60 s.
	Timeout time.Duration
}

// Machine is a booted container: systemd as PID 1 in systemd-nspawn, in a network namespace of its own.
type Machine struct {
	// Name is the machine name given to nspawn (unique per boot).
	Name string
	// Suite is the Debian release it runs.
	Suite string
	// Leader is the host PID of the machine's PID 1.
	Leader int
	// NS is the machine's network namespace, named with `ip netns attach` (a kpt- name, so the harness
	// removes it if this process dies).
	NS *harness.NetNS
	// BootTime is how long the boot took, from starting nspawn to the machine's READY=1.
	BootTime time.Duration

	cmd     *exec.Cmd
	exited  chan struct{}
	notify  *harness.NotifySocket
	console *os.File
	tmp     string
}

// Boot starts a machine from the suite's cached rootfs (with --volatile=overlay, --private-network) and
// waits until its systemd reports the boot finished. Shutdown must be called to stop it.
func Boot(ctx context.Context, opts BootOptions) (m *Machine, err error) {
	if opts.Timeout == 0 {
		opts.Timeout = 60 * time.Second
	}
	root := RootfsDir(opts.Suite)
	if _, err := os.Stat(filepath.Join(root, ".kp-lab-ready")); err != nil {
		return nil, fmt.Errorf("rootfs of %s missing (EnsureRootfs): %w", opts.Suite, err)
	}
	var rnd [3]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, fmt.Errorf("naming machine: %w", err)
	}
	suffix := fmt.Sprintf("%d-%s", os.Getpid(), hex.EncodeToString(rnd[:]))
	m = &Machine{Name: "kplab-" + opts.Suite + "-" + suffix, Suite: opts.Suite, exited: make(chan struct{})}
	defer func() {
		if err != nil {
			err = errors.Join(err, m.Shutdown())
		}
	}()
	if m.tmp, err = os.MkdirTemp("", "kplab-"); err != nil {
		return m, fmt.Errorf("creating machine state dir: %w", err)
	}
	if m.notify, err = harness.NewNotifySocket(m.tmp); err != nil {
		return m, err
	}
	if m.console, err = os.OpenFile(opts.ConsoleLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err != nil {
		return m, fmt.Errorf("opening console log: %w", err)
	}
	args := []string{
		"--quiet", "--directory=" + root, "--machine=" + m.Name,
		// A tmpfs upper layer over the cached tree: every boot starts pristine.
		"--volatile=overlay",
		// The host's PID 1 need not be systemd: no machined registration, no scope unit.
		"--register=no", "--keep-unit",
		// A network namespace with only a loopback: iptables inside cannot reach the host's rules.
		"--private-network",
		"--console=passive",
		// nspawn sends READY=1 (and X_NSPAWN_LEADER_PID) once the machine's systemd has booted.
		"--notify-ready=yes",
		"--bind-ro=" + opts.LabDir + ":/lab",
		"--boot", "systemd.show_status=false",
	}
	m.cmd = exec.Command("systemd-nspawn", args...)
	m.cmd.Env = append(os.Environ(), m.notify.Env())
	m.cmd.Stdout, m.cmd.Stderr = m.console, m.console
	// If this process dies, nspawn gets SIGTERM and powers the machine off.
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	start := time.Now()
	if err := m.cmd.Start(); err != nil {
		return m, fmt.Errorf("starting systemd-nspawn: %w", err)
	}
	go func() { _ = m.cmd.Wait(); close(m.exited) }()

	bootCtx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	for m.Leader == 0 || !m.readySent() {
		if m.Leader == 0 {
			m.Leader = m.leaderPID()
		}
		select {
		case <-m.exited:
			return m, fmt.Errorf("systemd-nspawn exited during boot (%v); console: %s", m.cmd.ProcessState, m.ConsoleTail(opts.ConsoleLog, 20))
		case <-bootCtx.Done():
			return m, fmt.Errorf("machine %s not booted within %v; console: %s", m.Name, opts.Timeout, m.ConsoleTail(opts.ConsoleLog, 20))
		case <-time.After(20 * time.Millisecond):
		}
	}
	m.BootTime = time.Since(start)

	nsName := fmt.Sprintf("%slab-%s", harness.NetNSPrefix, suffix)
	if out, err := exec.Command("ip", "netns", "attach", nsName, strconv.Itoa(m.Leader)).CombinedOutput(); err != nil {
		return m, fmt.Errorf("ip netns attach %s %d: %w: %s", nsName, m.Leader, err, strings.TrimSpace(string(out)))
	}
	m.NS = &harness.NetNS{Name: nsName}
	return m, nil
}

func (m *Machine) readySent() bool {
	for _, msg := range m.notify.Messages() {
		if strings.Contains("\n"+msg+"\n", "\nREADY=1\n") {
			return true
		}
	}
	return false
}

func (m *Machine) leaderPID() int {
	for _, msg := range m.notify.Messages() {
		for _, line := range strings.Split(msg, "\n") {
			if v, ok := strings.CutPrefix(line, "X_NSPAWN_LEADER_PID="); ok {
				if pid, err := strconv.Atoi(v); err == nil {
					return pid
				}
			}
		}
	}
	return 0
}

// ConsoleTail returns the last n lines of the console log.
func (m *Machine) ConsoleTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Result is the outcome of a command run inside the machine.
type Result struct {
	// Out is stdout and stderr, interleaved.
	Out string
	// Code is the exit status (-1 if the command did not run to an exit).
	Code int
	// Took is the wall time, from the host.
	Took time.Duration
}

// Run runs script with bash inside the machine (all of its namespaces, its root, cwd /lab), with a clean
// environment, and returns its combined output and exit status. An error means it could not be run at
// all or ctx ended; a non-zero exit is not an error.
func (m *Machine) Run(ctx context.Context, script string) (Result, error) {
	args := []string{"--target", strconv.Itoa(m.Leader), "--mount", "--uts", "--ipc", "--net", "--pid",
		// nsenter would open a --wd=DIR argument on the host: start in the target's cwd (/) and cd.
		"--root", "--wd", "--", "/usr/bin/env", "-i",
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8",
		"TERM=dumb", "SYSTEMD_PAGER=", "SYSTEMD_COLORS=0", "DEBIAN_FRONTEND=noninteractive",
		"/bin/bash", "-c", "cd /lab && " + script}
	cmd := exec.CommandContext(ctx, "nsenter", args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	err := cmd.Run()
	r := Result{Out: out.String(), Code: -1, Took: time.Since(start)}
	var exit *exec.ExitError
	switch {
	case err == nil:
		r.Code = 0
	case errors.As(err, &exit) && exit.Exited() && ctx.Err() == nil:
		r.Code = exit.ExitCode()
	default:
		return r, fmt.Errorf("running in %s: %w (output: %s)", m.Name, err, strings.TrimSpace(r.Out))
	}
	return r, nil
}

// Shutdown powers the machine off (SIGTERM to nspawn, which asks its systemd to power off), kills its
// PID 1 if that takes longer than 20 s, and removes the namespace handle and nspawn's leftovers. It is
// idempotent.
func (m *Machine) Shutdown() error {
	var errs []error
	if m.cmd != nil && m.cmd.Process != nil {
		select {
		case <-m.exited:
		default:
			_ = m.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-m.exited:
			case <-time.After(20 * time.Second):
				errs = append(errs, fmt.Errorf("machine %s did not power off within 20 s; killing its PID 1", m.Name))
				if m.Leader > 0 {
					_ = syscall.Kill(m.Leader, syscall.SIGKILL) // ends every process in its PID namespace
				}
				select {
				case <-m.exited:
				case <-time.After(10 * time.Second):
					_ = m.cmd.Process.Kill()
					<-m.exited
				}
			}
		}
	}
	if m.NS != nil {
		if out, err := exec.Command("ip", "netns", "delete", m.NS.Name).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("ip netns delete %s: %w: %s", m.NS.Name, err, strings.TrimSpace(string(out))))
		}
		m.NS = nil
	}
	// nspawn leaves an empty mount-propagation directory named after the machine.
	_ = os.Remove(filepath.Join("/run/systemd/nspawn/propagate", m.Name))
	if m.notify != nil {
		_ = m.notify.Close()
		m.notify = nil
	}
	if m.console != nil {
		_ = m.console.Close()
		m.console = nil
	}
	if m.tmp != "" {
		_ = os.RemoveAll(m.tmp)
		m.tmp = ""
	}
	return errors.Join(errs...)
}
