// Package xtables runs the iptables user-space tools for the dataplanes: backend detection (nft or legacy,
// whichever the node already uses), iptables-restore --noflush with the xtables lock, iptables-save, and the
// few single-rule operations (jump rules from built-in chains, canary chains) through go-iptables.
package xtables
