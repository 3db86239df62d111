// Package ipvs implements kube-proxy's IPVS mode: the kernel's L4 load balancer serves every Service
// address, and a small iptables ruleset keyed on ipsets does the masquerading and filtering around it, as
// upstream kube-proxy v1.37's IPVS mode does (same chain, set and link names, so a node can switch between
// the two).
//
// The pieces:
//   - a pure renderer (renderPort) turns each Service port of a proxy.Snapshot into virtual servers with
//     their real servers, the addresses to bind to the kube-ipvs0 dummy link, the ipset members, and the
//     load-balancer entries the node must not reach; renderRules writes the iptables-restore payload that
//     matches the sets. Both use the endpoints proxy/ selected (ClusterEndpoints, LocalEndpoints), so
//     Service semantics are decided in one place for both modes;
//   - a writer (Dataplane) diffs the desired state against the kernel and writes only the difference, through
//     narrow interfaces: IPVS over generic netlink (github.com/cloudflare/ipvs), links, addresses and
//     ipsets over netlink (github.com/vishvananda/netlink), iptables through rules/xtables. A partial
//     Apply renders again the Service ports snap.Changes reports and touches only the virtual servers, set
//     members and addresses they change; a full Apply reads the kernel's state and repairs every
//     difference, including changes made behind our back. It reads every real server at once from
//     /proc/net/ip_vs (upstream asks netlink once per virtual server, on every sync), which makes a full
//     resync of 10,000 Services several times cheaper.
//
// Behaviour worth knowing, and where it differs from upstream:
//   - Schedulers: ipvs.scheduler applies to every virtual server (rr when empty); mh gets the mh-port flag
//     as upstream. There is no per-Service override (the snapshot carries no annotations).
//   - Session affinity (ClientIP) is IPVS persistence with the Service's timeout and a host netmask.
//   - NodePorts are served on the node's addresses that nodePortAddresses selects (all when it is empty),
//     never on 127.0.0.0/8 or ::1 — like upstream's IPVS mode, and unlike iptables mode's
//     localhostNodePorts: IPVS cannot return replies from a pod to a loopback source. Partial syncs use the
//     addresses read at the last full sync; Watch asks for a full sync when they change, so a new node
//     address gets its NodePorts at once.
//   - Local traffic policies follow iptables mode rather than upstream's IPVS mode, which falls back to all
//     endpoints when there is no local one. internalTrafficPolicy Local without local endpoints: the
//     cluster IP has no real servers, and traffic to it from pods is dropped through our own set
//     KUBE-INTERNAL-NO-LOCAL (traffic the node itself sends gets IPVS's ICMP port unreachable instead).
//     externalTrafficPolicy Local without local endpoints: the external addresses (node ports, external
//     and load-balancer IPs) keep the Cluster endpoints, so the node and its pods still reach the Service
//     (iptables mode's short-circuit), and traffic from anywhere else is dropped through our set
//     KUBE-EXTERNAL-NO-LOCAL. With local endpoints, external addresses use only them, also for the node's
//     own pods (iptables mode sends those to any endpoint).
//   - A Service without any endpoint keeps its virtual servers without real servers: IPVS answers new
//     connections with ICMP port unreachable, which is iptables mode's REJECT.
//   - Removed TCP real servers drain: weight 0 while they have connections, deleted once they have none or
//     after DefaultDrainTimeout (upstream waits without a bound); a real server wanted again before that
//     gets its weight back (upstream deletes and re-adds it). UDP and SCTP real servers are deleted at once
//     (expire_nodest_conn ends their connections). Endpoints proxy/ still selects (serving, terminating
//     ones when nothing is ready) have weight 1.
//   - Sysctls are written once at start (and on reload), in the process's network namespace, only when
//     they differ: net/ipv4/vs/conntrack=1, expire_nodest_conn=1, expire_quiescent_template=1,
//     net/ipv4/ip_forward=1, conn_reuse_mode=0 on kernels 4.1 to 5.8, and with strictARP
//     conf/all/arp_ignore=1 and arp_announce=2. IPv6 forwarding is left to the administrator, as upstream.
//   - ipvs.excludeCIDRs protects other users' virtual servers from removal, as upstream. Cleanup removes
//     every virtual server, like upstream's --cleanup (ipvsadm --clear).
package ipvs
