package systemd

import (
	"context"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"k8s.io/klog/v2"
)

// Notifier sends sd_notify messages to the service manager. Without NOTIFY_SOCKET (not started by systemd)
// every call is a no-op.
type Notifier struct {
	notify func(state string) (bool, error)
}

// NewNotifier returns a Notifier for the socket named by NOTIFY_SOCKET.
func NewNotifier() *Notifier {
	return &Notifier{notify: func(state string) (bool, error) { return daemon.SdNotify(false, state) }}
}

func (n *Notifier) send(state string) {
	if _, err := n.notify(state); err != nil {
		klog.ErrorS(err, "sd_notify failed", "state", state)
	}
}

// Ready reports that start-up (or a reload) is complete, with a status line for `systemctl status`.
func (n *Notifier) Ready(status string) {
	n.send(daemon.SdNotifyReady + "\nSTATUS=" + status)
}

// Reloading reports that a configuration reload has begun (with the MONOTONIC_USEC systemd 253+ expects).
// Ready must follow once it is done.
func (n *Notifier) Reloading() {
	n.send(daemon.SdNotifyReloading + "\n" + daemon.SdNotifyMonotonicUsec() + "\nSTATUS=Reloading configuration")
}

// Stopping reports that shutdown has begun.
func (n *Notifier) Stopping() {
	n.send(daemon.SdNotifyStopping + "\nSTATUS=Stopping")
}

// Status updates the free-form status line.
func (n *Notifier) Status(status string) {
	n.send("STATUS=" + status)
}

// Watchdog pings the service manager's watchdog at half the configured interval for as long as alive
// returns true, until ctx is done. A hung sync loop stops the pings, so systemd restarts the daemon; a
// loop whose syncs fail keeps them (a restart would not fix the kernel's refusal). It returns at once
// when the watchdog is not enabled for this process.
func (n *Notifier) Watchdog(ctx context.Context, alive func() bool) {
	interval, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		klog.ErrorS(err, "Reading the watchdog settings")
		return
	}
	if interval <= 0 {
		return
	}
	klog.V(2).InfoS("Watchdog enabled", "interval", interval)
	n.watchdogLoop(ctx, interval/2, alive)
}

func (n *Notifier) watchdogLoop(ctx context.Context, every time.Duration, alive func() bool) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	wasAlive := true
	for {
		if alive() {
			n.send(daemon.SdNotifyWatchdog)
			if !wasAlive {
				klog.InfoS("Sync loop turning again; watchdog pings resumed")
			}
			wasAlive = true
		} else if wasAlive {
			klog.ErrorS(nil, "Sync loop stuck; withholding watchdog pings")
			wasAlive = false
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
