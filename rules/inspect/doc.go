// Package inspect is the operator's side of the daemon: `kube-proxy trace`, `diff` and `doctor`. It reads
// the live kernel state of whichever mode is in place (the iptables rules of both backends and families,
// the nftables `kube-proxy` tables), loads it into the packet tracers the tests use (rules/iptables/iptrace,
// rules/nftables/nftrace), renders what the daemon would write for the API's current state with the
// daemon's own code, and checks the node's prerequisites. It never writes to the kernel: it runs the
// iptables save tools and `nft list`, reads /proc and /sys, and asks the API server and the daemon's own
// health and metrics endpoints.
//
// Rules outside kube-proxy's chains (another firewall's, a CNI's) are not walked: the tracer would refuse
// shapes it does not model. They are listed instead, with their position against the jump into our
// chains, since a rule ahead of that jump can take the packet first.
package inspect
