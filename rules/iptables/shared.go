package iptables

import (
	"fmt"
	"hash/maphash"
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/proxy"
	"kube-proxy/rules/xtables"
)

// Dispatch: above dispatchOn Service ports, nat KUBE-SERVICES stops listing every cluster IP. It jumps, by
// the last byte of the destination address, to one of up to 256 bucket chains that each hold the cluster-IP
// rules of the Services whose cluster IP ends in that byte. A new connection then crosses at most 256 + N/256
// rules instead of N, and a change to one Service rewrites its bucket (N/256 rules) instead of all of
// KUBE-SERVICES. Below the threshold KUBE-SERVICES keeps upstream's exact shape. The switch has hysteresis
// so that a cluster hovering around the threshold does not flip at every sync.
const (
	dispatchOn  = 1000
	dispatchOff = 900
	// bucketPrefix names bucket chains "KUBE-SVC-0BUCKET-XX". The "KUBE-SVC-" prefix makes upstream
	// kube-proxy delete them as stale Service chains when a node switches back; the "0" cannot occur in
	// upstream's base32 hashes, so a bucket never collides with a Service chain.
	bucketPrefix = "KUBE-SVC-0BUCKET-"
)

// bucketChains are the 256 bucket chain names.
var bucketChains = func() [256]string {
	var n [256]string
	for i := range n {
		n[i] = fmt.Sprintf("%s%02X", bucketPrefix, i)
	}
	return n
}()

// bucketOf is the bucket of a cluster IP: its last byte.
func bucketOf(ip netip.Addr) int {
	b := ip.As16()
	return int(b[15])
}

// isBucketChain reports whether a chain is one of the dispatch buckets.
func isBucketChain(name string) bool {
	return len(name) == len(bucketPrefix)+2 && name[:len(bucketPrefix)] == bucketPrefix
}

// chainOut is the rules of one shared chain for the render in progress.
type chainOut struct {
	table, name string
	w           xtables.Lines
	// write is set when the chain is declared and written in this payload: always on a full render,
	// otherwise only when its rules differ from what the last render wrote.
	write bool
}

// sharedChains keeps the shared chains between renders, with a hash of what was last written into each, so
// that a partial render leaves out those that did not change.
type sharedChains struct {
	seed    maphash.Seed
	chains  map[string]*chainOut // by table/name
	written map[string]uint64
}

func newSharedChains() sharedChains {
	return sharedChains{seed: maphash.MakeSeed(), chains: map[string]*chainOut{}, written: map[string]uint64{}}
}

// get returns the (reset) buffer of a shared chain.
func (s *sharedChains) get(table, name string) *chainOut {
	key := table + "/" + name
	c := s.chains[key]
	if c == nil {
		c = &chainOut{table: table, name: name}
		s.chains[key] = c
	}
	c.w.Reset()
	c.write = false
	return c
}

// settle decides whether c is written in this payload and records what was.
func (s *sharedChains) settle(c *chainOut, full bool) {
	key := c.table + "/" + c.name
	h := maphash.Bytes(s.seed, c.w.B)
	if old, ok := s.written[key]; full || !ok || old != h {
		c.write = true
		s.written[key] = h
	}
}

// forget drops a chain that no longer exists.
func (s *sharedChains) forget(table, name string) {
	key := table + "/" + name
	delete(s.chains, key)
	delete(s.written, key)
}

// reset forgets everything written, after a failed render.
func (s *sharedChains) reset() {
	clear(s.written)
}

// buildNAT computes the shared nat chains (KUBE-POSTROUTING, KUBE-MARK-MASQ, KUBE-SERVICES,
// KUBE-NODEPORTS) and, when dispatching, the bucket chains to consider: all on a full render, else those
// of touched. It returns them in payload order.
func (r *Renderer) buildNAT(snap *proxy.Snapshot, full bool, touched map[int]bool) []*chainOut {
	var counts [256]int // the cluster-IP rules per bucket, when dispatching
	if r.dispatch {
		for _, st := range r.order {
			if st.lines[fragNATClusterIP] > 0 {
				counts[bucketOf(st.sp.ClusterIP)]++
			}
		}
	}
	post, masq := r.buildMasquerade()
	services, nodePorts := r.buildServices(snap, &counts)
	out := append(r.natOut[:0], post, masq, services, nodePorts)
	out = r.buildBuckets(out, &counts, full, touched)
	r.retireBuckets(&counts)
	for _, c := range out {
		r.shared.settle(c, full)
	}
	r.natOut = out
	return out
}

// buildMasquerade computes KUBE-POSTROUTING and KUBE-MARK-MASQ.
func (r *Renderer) buildMasquerade() (post, masq *chainOut) {
	post = r.shared.get("nat", chainPostrouting)
	post.w.Rule(chainPostrouting).T("-m", "mark", "!", "--mark", r.mark+"/"+r.mark, "-j", "RETURN").End()
	// Clear the mark so that a packet traversing the stack again is not masqueraded twice.
	post.w.Rule(chainPostrouting).T("-j", "MARK", "--xor-mark", r.mark).End()
	post.w.Rule(chainPostrouting).Comment("kubernetes service traffic requiring SNAT").
		T("-j", "MASQUERADE", "--random-fully").End()
	masq = r.shared.get("nat", chainMarkMasq)
	masq.w.Rule(chainMarkMasq).T("-j", "MARK", "--or-mark", r.mark).End()
	return post, masq
}

// buildServices computes nat KUBE-SERVICES and KUBE-NODEPORTS from the ports' fragments. When dispatching,
// KUBE-SERVICES jumps to the buckets that counts has rules for instead of listing the cluster IPs.
func (r *Renderer) buildServices(snap *proxy.Snapshot, counts *[256]int) (services, nodePorts *chainOut) {
	services = r.shared.get("nat", chainServices)
	nodePorts = r.shared.get("nat", chainNodePorts)
	if r.dispatch {
		for b, n := range counts {
			if n > 0 {
				services.w.Rule(chainServices).T("-d")
				services.w.B = append(services.w.B, ' ')
				services.w.B = bucketMatch(services.w.B, b, r.cfg.Family)
				services.w.T("-j", bucketChains[b]).End()
			}
		}
	}
	// The counted copies for 127.0.0.0/8 exist when the counter does; they are used while this node's
	// NodePorts answer on loopback.
	countLocalhost := r.cfg.LocalhostNodePortsActive(&snap.Node)
	for _, st := range r.order {
		if !r.dispatch {
			services.w.B = append(services.w.B, st.frag(fragNATClusterIP)...)
			services.w.Lines += st.lines[fragNATClusterIP]
		}
		services.w.B = append(services.w.B, st.frag(fragNATServices)...)
		services.w.Lines += st.lines[fragNATServices]
		if countLocalhost {
			nodePorts.w.B = append(nodePorts.w.B, st.frag(fragNATNodePortsLocal)...)
			nodePorts.w.Lines += st.lines[fragNATNodePortsLocal]
		}
		nodePorts.w.B = append(nodePorts.w.B, st.frag(fragNATNodePorts)...)
		nodePorts.w.Lines += st.lines[fragNATNodePorts]
	}
	r.writeNodePortJumps(&services.w, snap)
	return services, nodePorts
}

// buildBuckets sets r.bucketsNow and r.bucketRules from counts and, when dispatching, appends to out the
// bucket chains to (re)write: all on a full render, else those of touched and those the last render did
// not have.
func (r *Renderer) buildBuckets(out []*chainOut, counts *[256]int, full bool, touched map[int]bool) []*chainOut {
	r.bucketsNow = r.bucketsNow[:0]
	r.bucketRules = 0
	if !r.dispatch {
		return out
	}
	for b, n := range counts {
		if n > 0 {
			r.bucketsNow = append(r.bucketsNow, bucketChains[b])
			r.bucketRules += n
		}
	}
	var bufs [256]*chainOut
	for b, n := range counts {
		if n > 0 && (full || touched[b] || !r.bucketsLast[b]) {
			bufs[b] = r.shared.get("nat", bucketChains[b])
		}
	}
	for _, st := range r.order {
		if st.lines[fragNATClusterIP] == 0 {
			continue
		}
		if c := bufs[bucketOf(st.sp.ClusterIP)]; c != nil {
			// The fragment is "-A KUBE-SERVICES ...": the same rule in the bucket chain.
			f := st.frag(fragNATClusterIP)
			c.w.B = append(append(append(c.w.B, "-A "...), c.name...), f[len("-A "+chainServices):]...)
			c.w.Lines++
		}
	}
	for _, c := range bufs {
		if c != nil {
			out = append(out, c)
		}
	}
	return out
}

// retireBuckets adds to r.stale, and forgets, the buckets the last render had that emptied or that no
// longer exist because dispatch is off, then records in r.bucketsLast the buckets of this render.
func (r *Renderer) retireBuckets(counts *[256]int) {
	for b := range r.bucketsLast {
		if counts[b] == 0 || !r.dispatch {
			r.stale = append(r.stale, bucketChains[b])
			r.shared.forget("nat", bucketChains[b])
		}
	}
	clear(r.bucketsLast)
	for b, n := range counts {
		if n > 0 && r.dispatch {
			r.bucketsLast[b] = true
		}
	}
}

// bucketMatch appends the address/mask that selects bucket b: "0.0.0.b/0.0.0.255" or "::b/::ff".
func bucketMatch(b []byte, bucket int, family v1.IPFamily) []byte {
	if family == v1.IPv6Protocol {
		return fmt.Appendf(b, "::%x/::ff", bucket)
	}
	return fmt.Appendf(b, "0.0.0.%d/0.0.0.255", bucket)
}

// buildFilter computes the filter table's chains, in payload order.
func (r *Renderer) buildFilter(snap *proxy.Snapshot, full bool) []*chainOut {
	out := r.filterOut[:0]
	if r.cfg.LocalhostNodePortsActive(&snap.Node) {
		fw := r.shared.get("filter", chainKubeletFirewall)
		// route_localnet opens 127.0.0.0/8 to the network (https://issue.k8s.io/90259): drop what arrives
		// for loopback from elsewhere. Kubelet writes the same rule.
		fw.w.Rule(chainKubeletFirewall).Comment("block incoming localnet connections").
			T("-d", "127.0.0.0/8", "!", "-s", "127.0.0.0/8", "-m", "conntrack", "!", "--ctstate",
				"RELATED,ESTABLISHED,DNAT", "-j", "DROP").End()
		out = append(out, fw)
	}
	for _, part := range []struct {
		chain string
		frag  int
	}{{chainServices, fragFilterServices}, {chainExternalServices, fragFilterExternal},
		{chainProxyFirewall, fragFilterFirewall}, {chainNodePorts, fragFilterNodePorts}} {
		c := r.shared.get("filter", part.chain)
		for _, st := range r.order {
			c.w.B = append(c.w.B, st.frag(part.frag)...)
			c.w.Lines += st.lines[part.frag]
		}
		out = append(out, c)
	}
	fwd := r.shared.get("filter", chainForward)
	if !r.cfg.TCPBeLiberal {
		// Out-of-window packets would reset connections (https://issue.k8s.io/74839); those dropped are
		// counted for kubeproxy_iptables_ct_state_invalid_dropped_packets_total when the counter exists.
		fwd.w.Rule(chainForward).T("-m", "conntrack", "--ctstate", "INVALID")
		if r.cfg.NFAcct.InvalidDropped {
			fwd.w.T("-m", "nfacct", "--nfacct-name", CounterInvalidDropped)
		}
		fwd.w.T("-j", "DROP").End()
	}
	fwd.w.Rule(chainForward).Comment("kubernetes forwarding rules").
		T("-m", "mark", "--mark", r.mark+"/"+r.mark, "-j", "ACCEPT").End()
	fwd.w.Rule(chainForward).Comment("kubernetes forwarding conntrack rule").
		T("-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT").End()
	out = append(out, fwd)
	for _, c := range out {
		r.shared.settle(c, full)
	}
	r.filterOut = out
	return out
}

// declared returns the sorted names of the chains of cs that are written.
func declared(dst []string, cs []*chainOut) []string {
	for _, c := range cs {
		if c.write {
			dst = append(dst, c.name)
		}
	}
	slices.Sort(dst)
	return dst
}
