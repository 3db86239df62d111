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

	"kube-proxy/config"
)

// The reload handshake. systemd 252 (Debian 12, RHEL 9) has no Type=notify-reload, and with
// `ExecReload=kill -HUP $MAINPID` a `systemctl reload` returns before the daemon has re-read its config.
// So the unit runs `kube-proxy reload $MAINPID` instead: it signals the daemon and waits until the daemon
// records the outcome of that reload in its runtime directory. This works the same on every systemd version.

const reloadStatusFile = "reload-status"

// reloadRequestsDir holds one file per waiting `kube-proxy reload`, named by the helper; the daemon takes
// the files present when a reload starts and answers each with <name>.done, that reload's outcome. A
// helper thus gets the outcome of a reload that started after it asked, never that of an earlier one that
// it (or another helper) stopped waiting for. The daemon creates the directory at start: a helper that
// finds none talks to an older daemon, and falls back to comparing generations.
const reloadRequestsDir = "reload-requests"

// doneSuffix marks an answer in reloadRequestsDir; answers nobody collected go after doneKeep.
const (
	doneSuffix = ".done"
	doneKeep   = 10 * time.Minute
)

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

// WriteReloadStatus records the outcome of reload number gen in dir (atomically). A missing dir is not an
// error: the daemon may run outside systemd.
func WriteReloadStatus(dir string, st config.ReloadResult) error {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return writeAtomic(dir, reloadStatusFile, statusLine(st))
}

func statusLine(st config.ReloadResult) []byte {
	return fmt.Appendf(nil, "%d %s %s\n", st.Generation, st.Result, strings.ReplaceAll(st.Message, "\n", " "))
}

// writeAtomic writes dir/name through a temporary file and a rename, so readers see all of it or nothing.
func writeAtomic(dir, name string, body []byte) error {
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, body, 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", name, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		return fmt.Errorf("writing %s: %w", name, err)
	}
	return nil
}

// ReadReloadStatus reads the last recorded reload outcome (generation 0 when none).
func ReadReloadStatus(dir string) (config.ReloadResult, error) {
	b, err := os.ReadFile(filepath.Join(dir, reloadStatusFile))
	if errors.Is(err, os.ErrNotExist) {
		return config.ReloadResult{}, nil
	}
	if err != nil {
		return config.ReloadResult{}, fmt.Errorf("reading reload status: %w", err)
	}
	return parseReloadStatus(b)
}

func parseReloadStatus(b []byte) (config.ReloadResult, error) {
	fields := strings.SplitN(strings.TrimSpace(string(b)), " ", 3)
	gen, err := strconv.ParseUint(fields[0], 10, 64)
	if err != nil || len(fields) < 2 {
		return config.ReloadResult{}, fmt.Errorf("reading reload status: malformed %q", b)
	}
	st := config.ReloadResult{Generation: gen, Result: fields[1]}
	if len(fields) == 3 {
		st.Message = fields[2]
	}
	return st, nil
}

// ReloadAndWait sends SIGHUP to pid and waits until the daemon records the outcome of a reload that
// started after this request, or timeout passes. It returns an error when the daemon rejected the new
// configuration (it keeps running with the old one), so `systemctl reload` fails visibly.
func ReloadAndWait(pid int, dir string, timeout time.Duration) error {
	if pid <= 1 {
		return fmt.Errorf("invalid main PID %d", pid)
	}
	requests := filepath.Join(dir, reloadRequestsDir)
	if _, err := os.Stat(requests); err != nil {
		return reloadAndWaitGeneration(pid, dir, timeout)
	}
	id := fmt.Sprintf("%d-%d", os.Getpid(), time.Now().UnixNano())
	req := filepath.Join(requests, id)
	f, err := os.OpenFile(req, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("asking for a reload: %w", err)
	}
	f.Close()
	answer := req + doneSuffix
	if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
		os.Remove(req)
		return fmt.Errorf("signalling PID %d: %w", pid, err)
	}
	err = awaitAnswer(pid, timeout, func() (bool, error) {
		b, err := os.ReadFile(answer)
		if errors.Is(err, os.ErrNotExist) {
			return false, nil
		}
		os.Remove(answer)
		if err != nil {
			return true, fmt.Errorf("reading the reload's outcome: %w", err)
		}
		st, err := parseReloadStatus(b)
		if err != nil {
			return true, err
		}
		return true, outcome(st)
	})
	if err != nil {
		os.Remove(req) // not taken yet: no later reload owes this helper an answer
	}
	return err
}

// reloadAndWaitGeneration is the handshake with a daemon that predates reload requests: wait for a
// reload status newer than the one before the signal.
func reloadAndWaitGeneration(pid int, dir string, timeout time.Duration) error {
	before, err := ReadReloadStatus(dir)
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
		return fmt.Errorf("signalling PID %d: %w", pid, err)
	}
	return awaitAnswer(pid, timeout, func() (bool, error) {
		st, err := ReadReloadStatus(dir)
		if err != nil || st.Generation <= before.Generation {
			return false, nil
		}
		return true, outcome(st)
	})
}

// awaitAnswer polls done until it reports an answer, pid exits, or timeout passes.
func awaitAnswer(pid int, timeout time.Duration, done func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if ok, err := done(); ok {
			return err
		}
		if err := syscall.Kill(pid, 0); err != nil {
			return fmt.Errorf("PID %d is gone: %w", pid, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("the daemon did not finish reloading within %s", timeout)
}

// outcome is a reload status as the helper's result.
func outcome(st config.ReloadResult) error {
	if st.Result == config.ReloadApplied {
		return nil
	}
	return fmt.Errorf("reload %s: %s (the daemon keeps running with its previous configuration)", st.Result, st.Message)
}

// TakeReloadRequests removes and returns the waiting helpers' requests in dir: the reload starting now
// answers them (AnswerReloadRequests). Call it before the configuration is read.
func TakeReloadRequests(dir string) []string {
	requests := filepath.Join(dir, reloadRequestsDir)
	entries, err := os.ReadDir(requests)
	if err != nil {
		return nil
	}
	var ids []string
	for _, e := range entries {
		name := e.Name()
		if strings.HasSuffix(name, doneSuffix) {
			if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > doneKeep {
				os.Remove(filepath.Join(requests, name)) // its helper gave up long ago
			}
			continue
		}
		if strings.HasPrefix(name, ".") {
			continue
		}
		if os.Remove(filepath.Join(requests, name)) == nil {
			ids = append(ids, name)
		}
	}
	return ids
}

// AnswerReloadRequests records st as the outcome for each request taken for this reload.
func AnswerReloadRequests(dir string, ids []string, st config.ReloadResult) error {
	var errs []error
	for _, id := range ids {
		errs = append(errs, writeAtomic(filepath.Join(dir, reloadRequestsDir), id+doneSuffix, statusLine(st)))
	}
	return errors.Join(errs...)
}

// ResetReloadStatus removes a status left by a previous run of the daemon, so that reload numbering can
// start again from one, and makes an empty requests directory (helpers use it from then on). A missing
// dir is not an error: the daemon may run outside systemd.
func ResetReloadStatus(dir string) error {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	err := os.Remove(filepath.Join(dir, reloadStatusFile))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing stale reload status: %w", err)
	}
	requests := filepath.Join(dir, reloadRequestsDir)
	if err := os.RemoveAll(requests); err != nil {
		return fmt.Errorf("removing stale reload requests: %w", err)
	}
	if err := os.Mkdir(requests, 0o755); err != nil {
		return fmt.Errorf("making the reload requests directory: %w", err)
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
