package ipvs

import (
	"fmt"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// A listing as a 6.1 kernel prints it (IPv4, IPv6, persistence, a fwmark service, a draining server).
const procSample = `IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port Forward Weight ActiveConn InActConn
TCP  0A60000A:0050 rr 
  -> 0AF40102:0050      Masq    1      0          3         
  -> 0AF40202:0050      Masq    0      2          0         
UDP  0A600035:0035 sh persistent 10800 FFFFFFFF
  -> 0AF40302:0035      Masq    1      0          1         
TCP  0A60000B:0050 rr 
FWM  00000001 rr 
  -> 0AF40402:0050      Masq    1      0          0         
TCP  [fd00:0096:0000:0000:0000:0000:0000:0010]:0050 rr 
  -> [fd00:0010:0244:0001:0000:0000:0000:0002]:1F90      Masq    1      0          0         
`

func TestParseProcIPVS(t *testing.T) {
	got, err := parseProcIPVS([]byte(procSample))
	if err != nil {
		t.Fatal(err)
	}
	want := map[vsKey][]kernelReal{
		key(protoTCP, "10.96.0.10:80"): {
			{key: rkey("10.244.1.2:80"), weight: 1, inactive: 3},
			{key: rkey("10.244.2.2:80"), weight: 0, active: 2},
		},
		key(protoUDP, "10.96.0.53:53"):    {{key: rkey("10.244.3.2:53"), weight: 1, inactive: 1}},
		key(protoTCP, "10.96.0.11:80"):    {},
		key(protoTCP, "[fd00:96::10]:80"): {{key: rkey("[fd00:10:244:1::2]:8080"), weight: 1}},
	}
	if diff := cmp.Diff(dumpReals(want), dumpReals(got)); diff != "" {
		t.Errorf("parseProcIPVS (-want +got):\n%s", diff)
	}
	if _, err := parseProcIPVS([]byte("h\nh\nh\nTCP  0A60000A\n")); err == nil {
		t.Error("a line without a port parsed")
	}
}

func dumpReals(m map[vsKey][]kernelReal) []string {
	var out []string
	for k, rs := range m {
		out = append(out, k.String())
		for _, r := range rs {
			out = append(out, fmt.Sprintf("%s -> %s w%d a%d i%d", k, r.key, r.weight, r.active, r.inactive))
		}
	}
	slices.Sort(out)
	return out
}
