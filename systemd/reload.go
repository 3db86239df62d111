package systemd

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The reload handshake. systemd 252 (Debian 12, RHEL 9) has no Type=notify-reload, and with
// `ExecReload=kill -HUP $MAINPID` a `systemctl reload` returns before the daemon has re-read its config.
// So the unit runs `kube-proxy reload $MAINPID` instead: it signals the daemon and waits until the daemon
// records the outcome of that reload in its runtime directory. This works the same on every systemd version.

// Reload outcomes recorded in the status file.
const (
	ReloadApplied         = "applied"
	ReloadInvalid         = "invalid"
	ReloadRestartRequired = "restart-required"
)

const reloadStatusFile = "reload-status"

// RuntimeDir returns the daemon's runtime directory: $RUNTIME_DIRECTORY (set by systemd's
// RuntimeDirectory=) or /run/kube-proxy.
func RuntimeDir() string {
	if d := os.Getenv("RUNTIME_DIRECTORY"); d != "" {
		// systemd passes a colon-separated list when several directories are configured.
		d, _, _ = strings.Cut(d, ":")
		return d
	}
	return "/run/kube-proxy"
}

// ReloadStatus is one reload's outcome.
type ReloadStatus struct {
	Generation uint64
	Result     string
	Message    string
}

// WriteReloadStatus records the outcome of reload number gen in dir (atomically). A missing dir is not an
// error: the daemon may run outside systemd.
func WriteReloadStatus(dir string, st ReloadStatus) error {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	body := fmt.Sprintf("%d %s %s\n", st.Generation, st.Result, strings.ReplaceAll(st.Message, "\n", " "))
	tmp := filepath.Join(dir, "."+reloadStatusFile+".tmp")
	if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
		return fmt.Errorf("writing reload status: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, reloadStatusFile)); err != nil {
		return fmt.Errorf("writing reload status: %w", err)
	}
	return nil
}

// ReadReloadStatus reads the last recorded reload outcome (generation 0 when none).
func ReadReloadStatus(dir string) (ReloadStatus, error) {
	b, err := os.ReadFile(filepath.Join(dir, reloadStatusFile))
	if errors.Is(err, os.ErrNotExist) {
		return ReloadStatus{}, nil
	}
	if err != nil {
		return ReloadStatus{}, fmt.Errorf("reading reload status: %w", err)
	}
	fields := strings.SplitN(strings.TrimSpace(string(b)), " ", 3)
	gen, err := strconv.ParseUint(fields[0], 10, 64)
	if err != nil || len(fields) < 2 {
		return ReloadStatus{}, fmt.Errorf("reading reload status: malformed %q", b)
	}
	st := ReloadStatus{Generation: gen, Result: fields[1]}
	if len(fields) == 3 {
		st.Message = fields[2]
	}
	return st, nil
}

// ReloadAndWait sends SIGHUP to pid and waits until the daemon records a newer reload outcome in dir, or
// timeout passes. It returns an error when the daemon rejected the new configuration (it keeps running with
// the old one), so `systemctl reload` fails visibly.
func ReloadAndWait(pid int, dir string, timeout time.Duration) error {
	if pid <= 1 {
		return fmt.Errorf("invalid main PID %d", pid)
	}
	before, err := ReadReloadStatus(dir)
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
		return fmt.Errorf("signalling PID %d: %w", pid, err)
	}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		st, err := ReadReloadStatus(dir)
		if err == nil && st.Generation > before.Generation {
			switch st.Result {
			case ReloadApplied:
				return nil
			default:
				return fmt.Errorf("reload %s: %s (the daemon keeps running with its previous configuration)", st.Result, st.Message)
			}
		}
		if err := syscall.Kill(pid, 0); err != nil {
			return fmt.Errorf("PID %d is gone: %w", pid, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("the daemon did not finish reloading within %s", timeout)
}

// ResetReloadStatus removes a status left by a previous run of the daemon, so that reload numbering can
// start again from one.
func ResetReloadStatus(dir string) error {
	err := os.Remove(filepath.Join(dir, reloadStatusFile))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing stale reload status: %w", err)
	}
	return nil
}

// ReloadCommand is `kube-proxy reload PID`, the unit's ExecReload: signal the daemon and wait (up to two
// minutes) for the outcome of its reload, recorded in RuntimeDir.
func ReloadCommand(pidArg string) error {
	pid, err := strconv.Atoi(pidArg)
	if err != nil {
		return fmt.Errorf("not a PID: %q", pidArg)
	}
	return ReloadAndWait(pid, RuntimeDir(), 2*time.Minute)
}
