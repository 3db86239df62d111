package inspect

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/rules/iptables/iptrace"
)

// ipSet is one ipset as `ipset save` prints it.
type ipSet struct {
	name, typ string
	family    v1.IPFamily
	members   []string
}

// readIPSets returns the node's ipsets (mode ipvs' KUBE-* sets among them); none without the ipset tool.
func readIPSets(ctx context.Context) ([]ipSet, error) {
	if _, err := exec.LookPath("ipset"); err != nil {
		return nil, nil
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "ipset", "save")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("ipset save: %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	return parseIPSetSave(stdout.String())
}

// parseIPSetSave reads `ipset save` output: "create NAME TYPE family inet|inet6 ..." and "add NAME MEMBER".
func parseIPSetSave(text string) ([]ipSet, error) {
	var sets []ipSet
	index := map[string]int{}
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 3 && f[0] == "create":
			// Sets without a family (bitmap:port) belong to the family their name says: mode ipvs names
			// its IPv6 sets KUBE-6-*.
			s := ipSet{name: f[1], typ: f[2], family: v1.IPv4Protocol}
			if strings.HasPrefix(s.name, "KUBE-6-") {
				s.family = v1.IPv6Protocol
			}
			for i := 3; i+1 < len(f); i++ {
				if f[i] == "family" {
					s.family = map[bool]v1.IPFamily{true: v1.IPv6Protocol, false: v1.IPv4Protocol}[f[i+1] == "inet6"]
				}
			}
			index[s.name] = len(sets)
			sets = append(sets, s)
		case len(f) >= 3 && f[0] == "add":
			i, ok := index[f[1]]
			if !ok {
				return nil, fmt.Errorf("ipset save: member of unknown set %s", f[1])
			}
			sets[i].members = append(sets[i].members, f[2])
		}
	}
	return sets, nil
}

// ipvsService is one IPVS virtual server as ipvsadm -Sn lists it.
type ipvsService struct {
	iptrace.VirtualServer
	// Key is "tcp/10.96.0.10:80"; Scheduler the scheduler; Timeout the persistence (0: none).
	Key       string
	Scheduler string
	Timeout   uint32
}

// tracerServers returns the virtual servers as the tracer takes them.
func tracerServers(svcs []ipvsService) []iptrace.VirtualServer {
	out := make([]iptrace.VirtualServer, len(svcs))
	for i, s := range svcs {
		out[i] = s.VirtualServer
	}
	return out
}

// readIPVS returns the IPVS virtual servers (none when the kernel has no IPVS or ipvsadm is missing).
func readIPVS(ctx context.Context) ([]ipvsService, error) {
	if _, err := os.Stat("/proc/net/ip_vs"); err != nil {
		return nil, nil
	}
	if _, err := exec.LookPath("ipvsadm"); err != nil {
		return nil, fmt.Errorf("the kernel has IPVS but ipvsadm is not installed: IPVS virtual servers not read")
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "ipvsadm", "-Sn")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("ipvsadm -Sn: %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	return parseIPVSSave(stdout.String())
}

// parseIPVSSave reads `ipvsadm -Sn` output: "-A -t|-u|--sctp-service ADDR:PORT -s SCHED [-p SECONDS]"
// and "-a -t ADDR:PORT -r ADDR:PORT -m -w WEIGHT". Firewall-mark services are skipped.
func parseIPVSSave(text string) ([]ipvsService, error) {
	var vss []ipvsService
	index := map[string]int{}
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || (f[0] != "-A" && f[0] != "-a") {
			continue
		}
		proto := map[string]string{"-t": "tcp", "--tcp-service": "tcp", "-u": "udp", "--udp-service": "udp", "--sctp-service": "sctp"}[f[1]]
		if proto == "" {
			continue // -f: firewall mark
		}
		key := proto + "/" + f[2]
		if f[0] == "-A" {
			ap, err := netip.ParseAddrPort(f[2])
			if err != nil {
				return nil, fmt.Errorf("ipvsadm -Sn: virtual server %q: %w", f[2], err)
			}
			vs := ipvsService{VirtualServer: iptrace.VirtualServer{Addr: ap.Addr(), Port: ap.Port(), Protocol: proto},
				Key: proto + "/" + ap.String()}
			for i := 3; i < len(f); i++ {
				switch f[i] {
				case "-p", "--persistent":
					vs.Persistent = true
					if i+1 < len(f) {
						if t, err := strconv.ParseUint(f[i+1], 10, 32); err == nil {
							vs.Timeout = uint32(t)
						}
					}
				case "-s", "--scheduler":
					if i+1 < len(f) {
						vs.Scheduler = f[i+1]
					}
				}
			}
			index[key] = len(vss)
			vss = append(vss, vs)
			continue
		}
		i, ok := index[key]
		if !ok {
			return nil, fmt.Errorf("ipvsadm -Sn: real server of unknown virtual server %s", key)
		}
		var rs iptrace.RealServer
		rs.Weight = 1
		for j := 3; j+1 < len(f); j++ {
			switch f[j] {
			case "-r", "--real-server":
				ap, err := netip.ParseAddrPort(f[j+1])
				if err != nil {
					return nil, fmt.Errorf("ipvsadm -Sn: real server %q: %w", f[j+1], err)
				}
				rs.Addr = ap
			case "-w", "--weight":
				w, err := strconv.Atoi(f[j+1])
				if err != nil {
					return nil, fmt.Errorf("ipvsadm -Sn: weight %q: %w", f[j+1], err)
				}
				rs.Weight = w
			}
		}
		vss[i].Reals = append(vss[i].Reals, rs)
	}
	return vss, nil
}
