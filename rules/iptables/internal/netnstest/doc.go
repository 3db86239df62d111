// Package netnstest runs iptables-restore and iptables-save inside throwaway network namespaces for the
// tests of the iptables renderer and tracer. Tests run only as root with KP_E2E set; they never touch the
// root namespace's rules.
package netnstest
