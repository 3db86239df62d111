// Package nftrace is a small model of kube-proxy's nftables tables for tests and operator commands: it
// parses the `kube-proxy` tables (families ip and ip6) from knftables-style transactions or from `nft list`
// output into one model, keeps them as the kernel would after a sequence of transactions, and walks the
// first packet of a connection through them, following every numgen branch, to report which endpoints it
// can reach, whether it is masqueraded, or where it is dropped or rejected. It is the nftables counterpart
// of rules/iptables/iptrace, with the same Packet, Outcome and Result shapes.
//
// Input (Tables.Load, atomic like `nft -f`): `add|create` of table, chain (base chains with type, hook,
// a numeric or named priority such as dstnat, "dstnat - 10" or "dstnat-10", policy, comment), set and map
// (type or typeof, flags, timeout, comment), element (with a comment between key and value, as knftables
// writes it) and counter; `insert rule` (at the front); `flush` of ruleset, table (rules only, as the
// kernel does), chain, set and map; `delete` and `destroy` of table, chain, set, map, element and counter,
// refused while something refers to the object, as the kernel does. `nft list table|ruleset` output (nft
// 1.0.6, with or without -a handles) in the same model; a listed table replaces the one held. Tables other
// than ip/ip6 kube-proxy are skipped and reported by Foreign. What the kernel or nft would refuse is
// refused: a missing chain, set or counter, a lookup key of the wrong type, a loop, dnat or masquerade
// reachable from a base chain whose type or hook does not allow it, a port mapping without a transport
// protocol match, a name nft cannot parse (IPv6 addresses in names need their colons replaced). Rule
// handles, positions, `replace` and `reset` are not supported.
//
// Rules: matches on ip/ip6 saddr and daddr (addresses, prefixes, anonymous sets, @sets, concatenations),
// meta l4proto, th dport and tcp/udp/sctp dport, iifname/oifname (with "*" wildcards), ct state, ct
// status, fib saddr/daddr type, mark (with an "and" mask), each also with "!="; verdict maps, named or
// anonymous, keyed by selectors or by numgen random mod N; statements counter (plain or named), mark set
// (or, xor, and, or a value), update @set { ip saddr }, masquerade (with flags), dnat to ADDR[:PORT] and
// dnat FAMILY addr . port to numgen random mod N map { ... }, reject (with ...), accept, drop, return,
// jump, goto, and a trailing comment. Anything else is an error naming the token, so an unexpected rule
// shape fails a test instead of being ignored. Maps must be verdict maps, with keys of types ipv4_addr,
// ipv6_addr, inet_proto and inet_service.
//
// Rules are kept in a canonical form (Rule.String, Tables.Rules, Tables.Dump) that is the same whether
// they were written in a transaction or printed back by nft, which rewrites several shapes:
// `mark set mark or 0x4000` prints as `meta mark set meta mark | 0x00004000`, `mark and 0x4000 != 0` as
// `meta mark & 0x00004000 != 0x00000000`, `meta l4proto tcp th dport 80` as `tcp dport 80`,
// `ip daddr { 10.0.0.0/8 }` as `ip daddr 10.0.0.0/8`, `dnat ip to 10.1.2.3:80` as `dnat to 10.1.2.3:80`,
// `dnat ip addr . port to numgen ...` as `dnat ip to numgen ...`, `counter` as `counter packets 0 bytes 0`,
// `reject with icmp type X` as `reject with icmp X`; anonymous sets are sorted.
//
// The walk: an arriving packet goes through the prerouting base chains, is routed on its destination after
// DNAT, then goes through the input chains, or the forward and postrouting chains; a local packet goes
// through the output chains, then postrouting. Outcome.Hook names base chains "FAMILY kube-proxy CHAIN".
// Not modelled: the input path a local packet DNATed to a local address takes after postrouting,
// connection tracking beyond the first packet (ct state is new; ct status is dnat once the walk has
// DNATed), and other tables' rules.
package nftrace
