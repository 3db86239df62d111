package ipvs

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"io"
	"math"
	"net/netip"
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
//
// It reads line by line from r and parses fields in place: at 10,000 virtual servers the listing is a few
// megabytes, read at every full sync, and reading it whole then splitting every line into strings
// allocated five times that.
func parseProcIPVS(r io.Reader) (map[vsKey][]kernelReal, error) {
	out := map[vsKey][]kernelReal{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	var cur *vsKey
	var buf [8][]byte
	for n := 1; sc.Scan(); n++ {
		line := sc.Bytes()
		if n <= 3 {
			continue // the headers
		}
		f := fields(line, buf[:0])
		if len(f) == 0 {
			continue
		}
		if string(f[0]) == "->" {
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
				v, ok := parseCount(f[3+i])
				if !ok {
					return nil, fmt.Errorf("line %d: %q: %q is not a number", n, line, f[3+i])
				}
				nums[i] = v
			}
			out[*cur] = append(out[*cur], kernelReal{key: newRealKey(addr, port), weight: nums[0], active: nums[1], inactive: nums[2]})
			continue
		}
		var proto protocol
		switch string(f[0]) {
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

// fields appends to out (up to its capacity) the space-separated fields of line, as slices of it.
func fields(line []byte, out [][]byte) [][]byte {
	for len(line) > 0 && len(out) < cap(out) {
		line = bytes.TrimLeft(line, " \t")
		if len(line) == 0 {
			break
		}
		end := bytes.IndexAny(line, " \t")
		if end < 0 {
			end = len(line)
		}
		out = append(out, line[:end])
		line = line[end:]
	}
	return out
}

// parseCount parses a decimal count; a negative one (never seen) counts as 0, a larger one as the largest.
func parseCount(b []byte) (uint32, bool) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	if len(b) == 0 || len(b) > 19 { // 19 digits fit in 64 bits
		return 0, false
	}
	var v uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + uint64(c-'0')
	}
	switch {
	case neg:
		return 0, true
	case v > math.MaxUint32:
		return math.MaxUint32, true
	}
	return uint32(v), true
}

// parseHexAddrPort parses "0A60000A:0050" (IPv4 in hex) or "[fd00:...]:0050" (IPv6), ports in hex.
func parseHexAddrPort(s []byte) (netip.Addr, uint16, error) {
	i := bytes.LastIndexByte(s, ':')
	if i < 0 {
		return netip.Addr{}, 0, fmt.Errorf("%q: no port", s)
	}
	ps := s[i+1:]
	if len(ps) == 0 || len(ps) > 4 {
		return netip.Addr{}, 0, fmt.Errorf("%q: port %q is not 1-4 hex digits", s, ps)
	}
	var p uint16
	for _, c := range ps {
		d, ok := hexDigit(c)
		if !ok {
			return netip.Addr{}, 0, fmt.Errorf("%q: port %q is not hex", s, ps)
		}
		p = p<<4 | uint16(d)
	}
	host := s[:i]
	if len(host) >= 2 && host[0] == '[' && host[len(host)-1] == ']' {
		a, err := netip.ParseAddr(string(host[1 : len(host)-1]))
		return a, p, err
	}
	var raw [4]byte
	if n, err := hex.Decode(raw[:], host); err != nil || n != 4 || len(host) != 8 {
		return netip.Addr{}, 0, fmt.Errorf("%q: not an IPv4 address in hex", s)
	}
	return netip.AddrFrom4(raw), p, nil
}

func hexDigit(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
