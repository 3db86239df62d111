// Package netnstest runs commands (iptables-restore, iptables-save, nft) inside throwaway network namespaces for
// the tests of the renderers and tracers. Tests run only as root with KP_E2E set; they never touch the
// root namespace's rules.
package netnstest
