package main

import (
	"crypto/sha256"
	"encoding/base32"
	"strings"
)

// chainHash returns prefix + "-" + the first 16 characters of base32(sha256(parts joined)): upstream's
// scheme for per-Service and per-endpoint chain names, computed here independently of rules/ so that the
// observer checks both implementations against the same expectation.
func chainHash(prefix string, parts ...string) string {
	sum := sha256.Sum256([]byte(strings.Join(parts, "")))
	return prefix + "-" + base32.StdEncoding.EncodeToString(sum[:])[:16]
}

// svcPortName is "ns/name:port" (or "ns/name" for an unnamed port), as the chain hashes want it.
func svcPortName(namespace, name, port string) string {
	s := namespace + "/" + name
	if port != "" {
		s += ":" + port
	}
	return s
}

// svcChain returns the KUBE-SVC chain of a TCP Service port.
func svcChain(namespace, name, port string) string {
	return chainHash("KUBE-SVC", svcPortName(namespace, name, port), "tcp")
}

// sepChain returns the KUBE-SEP chain of one endpoint ("ip:port") of a TCP Service port.
func sepChain(namespace, name, port, endpoint string) string {
	return chainHash("KUBE-SEP", svcPortName(namespace, name, port), "tcp", endpoint)
}

// nftServiceChain returns the chain mode nftables gives a TCP Service port's endpoints (Cluster traffic
// policy): "service-" + the first 8 characters of base32(sha256("ns/name/tcp/port")) + "-ns/name/tcp/port",
// upstream's scheme, computed here independently of rules/nftables (names of these lengths are never cut).
func nftServiceChain(namespace, name, port string) string {
	base := namespace + "/" + name + "/tcp/" + port
	sum := sha256.Sum256([]byte(base))
	return "service-" + base32.StdEncoding.EncodeToString(sum[:])[:8] + "-" + base
}
