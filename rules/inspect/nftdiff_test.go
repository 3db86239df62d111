package inspect

import (
	"os"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/rules/nftables/nftrace"
)

// Mode nftables inserts a Service chain's new rules ahead of its old ones and deletes those a second
// later: unreachable old rules behind a chain's last verdict, and the affinity sets only they name, are
// not drift; an extra rule anywhere else is.
func TestDiffNFTablesToleratesSupersededRules(t *testing.T) {
	golden, err := os.ReadFile("../nftables/testdata/ipv4.golden")
	if err != nil {
		t.Fatal(err)
	}
	const (
		web       = "service-Y6QD5CCT-ns/web/tcp/http"
		sticky    = "service-OALSTAW3-ns/sticky/tcp/"
		oldSet    = "affinity-ZZZZZZZZ-ns/sticky/tcp/__10.244.9.9/8080"
		oldWeb    = "add rule ip kube-proxy " + web + " meta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 10.244.1.5 . 8080 , 1 : 10.244.2.6 . 8080 }\n"
		oldSticky = "add set ip kube-proxy " + oldSet + " { type ipv4_addr ; flags dynamic,timeout ; timeout 600s ; }\n" +
			"add rule ip kube-proxy " + sticky + " ip saddr @" + oldSet + " goto endpoint-CV2TSSUL-ns/sticky/tcp/__10.244.1.5/8080\n"
	)
	load := func(text string) *nftrace.Tables {
		t.Helper()
		ts := nftrace.New()
		if err := ts.Load(text); err != nil {
			t.Fatal(err)
		}
		return ts
	}
	want := load(string(golden))
	for _, c := range []struct {
		name  string
		live  string
		drift []string // substrings of the drift expected, none when empty
	}{
		{"old rules behind the new ones", string(golden) + oldWeb + oldSticky, nil},
		{"an extra rule ahead of the new ones", strings.Replace(string(golden),
			"add rule ip kube-proxy "+web+" ", strings.TrimSuffix(oldWeb, "\n")+"\nadd rule ip kube-proxy "+web+" ", 1),
			[]string{"stale rule " + web}},
		{"a stale affinity set no rule names", string(golden) + strings.SplitAfter(oldSticky, "\n")[0],
			[]string{"stale set " + oldSet}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var got []string
			for _, d := range DiffNFTables(want, load(c.live), v1.IPv4Protocol) {
				got = append(got, d.Kind+" "+d.Object)
			}
			if len(got) != len(c.drift) {
				t.Fatalf("drift %q, want %q", got, c.drift)
			}
			for i, w := range c.drift {
				if !strings.Contains(got[i], w) {
					t.Errorf("drift %q, want %q", got, c.drift)
				}
			}
		})
	}
}
