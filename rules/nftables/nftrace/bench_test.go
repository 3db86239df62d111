package nftrace

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

// bigTable is upstream4.nft's fixed part with n ClusterIP services of three endpoints each.
func bigTable(tb testing.TB, n int) string {
	var sb strings.Builder
	for _, l := range strings.Split(readFile(tb, "upstream4.nft"), "\n") {
		if strings.HasPrefix(l, "# ns1/") {
			break
		}
		sb.WriteString(l + "\n")
	}
	for i := range n {
		ch := fmt.Sprintf("service-%08d-ns/svc%d/tcp/p80", i, i)
		fmt.Fprintf(&sb, "add chain ip kube-proxy %s\n", ch)
		fmt.Fprintf(&sb, "add rule ip kube-proxy %s meta l4proto tcp dnat ip addr . port to numgen random mod 3 map { 0 : 10.1.%d.1 . 80 , 1 : 10.1.%d.2 . 80 , 2 : 10.1.%d.3 . 80 }\n", ch, i%250, i%250, i%250)
		fmt.Fprintf(&sb, "add element ip kube-proxy cluster-ips { %s }\n", bigIP(i))
		fmt.Fprintf(&sb, "add element ip kube-proxy service-ips { %s . tcp . 80 : goto %s }\n", bigIP(i), ch)
	}
	return sb.String()
}

func bigIP(i int) string { return fmt.Sprintf("172.30.%d.%d", i/250, i%250+1) }

func BenchmarkLoad(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		text := bigTable(b, n)
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			for b.Loop() {
				if err := New().Load(text); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPartialLoad replays a one-service change onto a loaded state, as a partial sync does.
func BenchmarkPartialLoad(b *testing.B) {
	ts := New()
	mustLoad(b, ts, bigTable(b, 10000))
	const tx = "flush chain ip kube-proxy service-00000007-ns/svc7/tcp/p80\n" +
		"add rule ip kube-proxy service-00000007-ns/svc7/tcp/p80 meta l4proto tcp dnat to 10.1.7.1:80\n"
	for b.Loop() {
		if err := ts.Load(tx); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkTrace(b *testing.B) {
	ts := New()
	mustLoad(b, ts, bigTable(b, 10000))
	pkt := fromPod("10.0.0.5", bigIP(9999), 80)
	pkt.LocalAddrs = []netip.Addr{netip.MustParseAddr("192.168.0.2")}
	for b.Loop() {
		res, err := ts.Trace(pkt)
		if err != nil || len(res.Outcomes) != 3 {
			b.Fatal(err, res)
		}
	}
}
