// Package systemd makes the daemon a good systemd citizen: sd_notify READY/RELOADING/STOPPING/STATUS
// messages, watchdog pings sent only while the sync loop turns, a reload handshake so that `systemctl
// reload` returns only after the daemon has re-read its configuration, on every systemd version, the
// log output (Logging: upstream's text or JSON format, split streams, journal priorities,
// verbosity/vmodule/flushFrequency changed on reload), and the unit's file descriptor store (FDStore),
// through which mode userspace's listening sockets pass to the next process on a restart. The unit file
// kube-proxy.service lives beside this package.
package systemd
