package ipvs

import (
	"fmt"
	"slices"
	"strings"
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
	got, err := parseProcIPVS(strings.NewReader(procSample))
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
	for _, bad := range []string{
		"TCP  0A60000A\n",          // no port
		"TCP  0A60000:0050 rr\n",   // seven hex digits
		"TCP  0A60000A:0050G rr\n", // not a hex port
		"TCP  0A60000A:0050 rr\n  -> 0AF40102:1F90 Masq 1 x 0\n", // not a count
		"TCP  0A60000A:0050 rr\n  -> 0AF40102:1F90 Masq 1\n",     // too few fields
	} {
		if _, err := parseProcIPVS(strings.NewReader("h\nh\nh\n" + bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	// Tabs separate fields too; counts beyond 32 bits are the largest.
	got, err = parseProcIPVS(strings.NewReader("h\nh\nh\nTCP\t0A60000A:0050\trr\n\t->\t0AF40102:1F90\tMasq\t1\t99999999999\t0\n"))
	if r := got[key(protoTCP, "10.96.0.10:80")]; err != nil || len(r) != 1 || r[0].active != 1<<32-1 || r[0].key != rkey("10.244.1.2:8080") {
		t.Errorf("tab-separated listing: %v, %v", r, err)
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
