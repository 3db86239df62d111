package config

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// parseIP parses an IP address the way Kubernetes does for configuration:
// besides what net.ParseIP accepts, dotted IPv4 quads with leading zeros
// ("010.001.002.003") are read as decimal, since older Go versions accepted
// them and existing configs contain them.
func parseIP(s string) net.IP {
	if ip := net.ParseIP(s); ip != nil {
		return ip
	}
	if strings.Contains(s, ":") {
		return nil
	}
	parts := strings.Split(s, ".")
	if len(parts) != 4 {
		return nil
	}
	var b [4]byte
	for i, p := range parts {
		if p == "" || len(p) > 3 {
			return nil
		}
		for _, r := range p {
			if r < '0' || r > '9' {
				return nil
			}
		}
		n, err := strconv.Atoi(p)
		if err != nil || n > 255 {
			return nil
		}
		b[i] = byte(n)
	}
	return net.IPv4(b[0], b[1], b[2], b[3])
}

// parseCIDR parses addr/prefix with parseIP's tolerance for leading zeros.
func parseCIDR(s string) (*net.IPNet, error) {
	addr, bits, ok := strings.Cut(s, "/")
	if !ok {
		return nil, fmt.Errorf("%q is not a CIDR (want address/prefix-length)", s)
	}
	ip := parseIP(addr)
	if ip == nil {
		return nil, fmt.Errorf("%q is not a CIDR: bad address %q", s, addr)
	}
	if ip.To4() != nil && !strings.Contains(addr, ":") {
		addr = ip.To4().String()
	}
	_, n, err := net.ParseCIDR(addr + "/" + bits)
	if err != nil {
		return nil, fmt.Errorf("%q is not a CIDR: bad prefix length %q", s, bits)
	}
	return n, nil
}

// validateHostPort checks an "ip:port" listen address.
func validateHostPort(s string) string {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Sprintf("%q must be ip:port (IPv6 as [ip]:port)", s)
	}
	var probs []string
	if parseIP(host) == nil {
		probs = append(probs, fmt.Sprintf("%q is not an IP address", host))
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		probs = append(probs, fmt.Sprintf("port %q must be a number in 1..65535", port))
	}
	if len(probs) == 0 {
		return ""
	}
	return fmt.Sprintf("%q: %s", s, strings.Join(probs, "; "))
}
