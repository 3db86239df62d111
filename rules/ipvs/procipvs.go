package ipvs

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// parseProcIPVS parses the kernel's /proc/net/ip_vs listing into the real servers of each virtual server
// (fwmark services are skipped). Its format has not changed since IPVS entered the kernel:
//
//	IP Virtual Server version 1.2.1 (size=4096)
//	Prot LocalAddress:Port Scheduler Flags
//	  -> RemoteAddress:Port Forward Weight ActiveConn InActConn
//	TCP  0A60000A:0050 rr
//	  -> 0AF40102:1F90      Masq    1      0          0
//	TCP  [fd00:0096:0000:0000:0000:0000:0000:0010]:0050 rr persistent 10800 FFFFFFFF
func parseProcIPVS(b []byte) (map[vsKey][]kernelReal, error) {
	out := map[vsKey][]kernelReal{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	var cur *vsKey
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if n <= 3 {
			continue // the headers
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if f[0] == "->" {
			if cur == nil {
				continue // a real server of a fwmark service
			}
			if len(f) < 6 {
				return nil, fmt.Errorf("line %d: %q: too few fields", n, line)
			}
			addr, port, err := parseHexAddrPort(f[1])
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", n, err)
			}
			var nums [3]uint32
			for i := range nums {
				v, err := strconv.ParseInt(f[3+i], 10, 64)
				if err != nil {
					return nil, fmt.Errorf("line %d: %q: %w", n, line, err)
				}
				nums[i] = uint32(max(v, 0))
			}
			out[*cur] = append(out[*cur], kernelReal{key: newRealKey(addr, port), weight: nums[0], active: nums[1], inactive: nums[2]})
			continue
		}
		var proto protocol
		switch f[0] {
		case "TCP":
			proto = protoTCP
		case "UDP":
			proto = protoUDP
		case "SCTP":
			proto = protoSCTP
		default: // FWM and protocols we never make
			cur = nil
			continue
		}
		if len(f) < 2 {
			return nil, fmt.Errorf("line %d: %q: too few fields", n, line)
		}
		addr, port, err := parseHexAddrPort(f[1])
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		k := newVSKey(addr, port, proto)
		out[k] = out[k][:0:0]
		cur = &k
	}
	return out, sc.Err()
}

// parseHexAddrPort parses "0A60000A:0050" (IPv4 in hex) or "[fd00:...]:0050" (IPv6), ports in hex.
func parseHexAddrPort(s string) (netip.Addr, uint16, error) {
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return netip.Addr{}, 0, fmt.Errorf("%q: no port", s)
	}
	p, err := strconv.ParseUint(s[i+1:], 16, 16)
	if err != nil {
		return netip.Addr{}, 0, fmt.Errorf("%q: port: %w", s, err)
	}
	host := s[:i]
	if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		a, err := netip.ParseAddr(host[1 : len(host)-1])
		return a, uint16(p), err
	}
	raw, err := hex.DecodeString(host)
	if err != nil || len(raw) != 4 {
		return netip.Addr{}, 0, fmt.Errorf("%q: not an IPv4 address in hex", s)
	}
	return netip.AddrFrom4([4]byte(raw)), uint16(p), nil
}
