package systemd

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"kube-proxy/config"
)

// Hooks connect the process lifecycle to the daemon.
type Hooks struct {
	// Ready is closed when the daemon is ready (informers synced, first sync done).
	Ready <-chan struct{}
	// Reload re-reads the configuration and returns once the result is in force (or refused).
	Reload func(ctx context.Context) config.ReloadResult
	// Alive gates the watchdog pings: the sync loop turns (not: the kernel took the last write).
	Alive func() bool
	// Status is a one-line summary for `systemctl status`.
	Status func() string
	// Done delivers the daemon's own exit (an error it cannot continue after), if any.
	Done <-chan error
}

// statusEvery is how often the STATUS line is refreshed (a variable for tests).
var statusEvery = 5 * time.Second

// Run drives the daemon's life under systemd (or without it: every notification is then a no-op): READY=1
// once Hooks.Ready closes; on SIGHUP, RELOADING=1, the reload, its recorded outcome, READY=1; watchdog
// pings while the sync loop is alive; on SIGTERM or SIGINT, STOPPING=1 and return. It also returns when the daemon ends by
// itself (Hooks.Done), with its error. SIGHUPs that arrive before the daemon is ready are handled once it is.
func Run(ctx context.Context, n *Notifier, h Hooks) error {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGHUP, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	dir := RuntimeDir()
	if err := ResetReloadStatus(dir); err != nil {
		klog.ErrorS(err, "Reload handshake may not work")
	}

	ready := h.Ready
	pendingHUP := false
	// The outcome of the last reload that was not applied, kept in the STATUS line (every refresh) until a
	// reload is applied: `systemctl status` must go on saying that the running configuration is not the file's.
	reloadNote := ""
	status := func() string {
		if reloadNote == "" {
			return h.Status()
		}
		return h.Status() + " (" + reloadNote + ")"
	}
	watchdogCtx, stopWatchdog := context.WithCancel(ctx)
	defer stopWatchdog()
	tick := time.NewTicker(statusEvery)
	defer tick.Stop()
	n.Status(h.Status())
	for {
		select {
		case <-ctx.Done():
			n.Stopping()
			return nil
		case err := <-h.Done:
			n.Stopping()
			return err
		case <-ready:
			ready = nil
			n.Ready(status())
			klog.InfoS("Ready: reported READY=1 to the service manager")
			go n.Watchdog(watchdogCtx, h.Alive)
			if pendingHUP {
				pendingHUP = false
				reload(ctx, n, h, dir, &reloadNote, status)
			}
		case <-tick.C:
			if ready == nil {
				n.Status(status())
			}
		case s := <-sigs:
			switch s {
			case syscall.SIGHUP:
				if ready != nil {
					klog.InfoS("SIGHUP before the first sync; reloading once ready")
					pendingHUP = true
					continue
				}
				reload(ctx, n, h, dir, &reloadNote, status)
			default:
				klog.InfoS("Stopping; the rules stay in place", "signal", s.String())
				n.Stopping()
				return nil
			}
		}
	}
}

// reload sends RELOADING=1, reloads, sets *note to the outcome when the reload was not applied (to "" when
// it was), sends READY=1 with the STATUS line, records the outcome and answers the waiting helpers.
func reload(ctx context.Context, n *Notifier, h Hooks, dir string, note *string, status func() string) {
	n.Reloading()
	waiting := TakeReloadRequests(dir)
	st := h.Reload(ctx)
	*note = ""
	if st.Result != config.ReloadApplied {
		*note = fmt.Sprintf("last reload %s: %s", st.Result, st.Message)
	}
	n.Ready(status())
	if err := WriteReloadStatus(dir, st); err != nil {
		klog.ErrorS(err, "Recording the reload outcome")
	}
	if err := AnswerReloadRequests(dir, waiting, st); err != nil {
		klog.ErrorS(err, "Answering the waiting reload helpers")
	}
}

// SetOOMScoreAdj writes the process's OOM score adjustment (oomScoreAdj; nil leaves it alone).
func SetOOMScoreAdj(v *int32) error {
	if v == nil {
		return nil
	}
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte(fmt.Sprintf("%d", *v)), 0o644); err != nil {
		return fmt.Errorf("setting oomScoreAdj %d: %w", *v, err)
	}
	return nil
}
