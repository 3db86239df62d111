// Package probe is what the end-to-end tests observe a daemon and its dataplane with, as plain functions
// that return errors: the daemon's Prometheus metrics, its health codes and log lines, and connections
// made to Services. It does not import testing, so the harness (whose testing.TB helpers wrap it),
// e2e/faults and the IPVS VM's guest agent (a program, built static) share one copy of each.
package probe
