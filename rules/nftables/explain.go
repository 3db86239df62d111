package nftables

import "strings"

// ServiceOfChain returns the Service port ("ns/name" or "ns/name:port") a per-Service chain's name
// carries ("service-", "external-" and "endpoint-" chains: prefix, hash, "-ns/name/protocol/port", see
// serviceBase and endpointBase); "" for any other chain. An endpoint chain's name goes on after the port
// ("__ip/port"), and that stays in the port part returned.
func ServiceOfChain(chain string) string {
	for _, prefix := range []string{prefixService, prefixEndpoint, prefixExternal} {
		rest, ok := strings.CutPrefix(chain, prefix)
		if !ok {
			continue
		}
		if _, name, ok := strings.Cut(rest, "-"); ok && strings.Count(name, "/") >= 3 {
			parts := strings.SplitN(name, "/", 4)
			if parts[3] == "" {
				return parts[0] + "/" + parts[1]
			}
			return parts[0] + "/" + parts[1] + ":" + parts[3]
		}
	}
	return ""
}

// AffinityHit reports whether rule (as nft lists it) is a session affinity check of a Service's chain:
// a match of the source address in an endpoint's affinity set, which holds the clients sent there before.
func AffinityHit(rule string) bool { return strings.Contains(rule, "saddr @"+prefixAffinity) }
