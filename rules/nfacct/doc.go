// Package nfacct reads and creates the kernel's extended accounting objects (nfacct, the nfnetlink
// subsystem NFNL_SUBSYS_ACCT): named packet and byte counters that iptables rules increment with
// `-m nfacct --nfacct-name NAME`. Mode iptables names two of them in its rules, as upstream kube-proxy
// does, and exports their packet counts as metrics read at every scrape (Collector).
//
// The objects belong to a network namespace and outlive the process; a rule that names one holds it, so
// the kernel refuses to delete it while the rule exists. Nothing here deletes them.
package nfacct
