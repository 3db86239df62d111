package nftrace

import (
	"flag"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"kube-proxy/rules/internal/netnstest"
)

var update = flag.Bool("update", false, "rewrite testdata/*.list from a real kernel (needs KP_E2E=1 and root)")

// TestKernelListings loads the transactions of formatPairs into a real kernel with `nft -f`, reads the
// state back with `nft list`, and checks that the listing parses to the same model as the transactions
// and as the saved listing in testdata (which -update rewrites).
func TestKernelListings(t *testing.T) {
	for _, p := range formatPairs {
		t.Run(p.name, func(t *testing.T) {
			ns := netnstest.New(t)
			fromTx := New()
			for _, f := range p.transactions {
				text := readFile(t, f)
				if _, err := ns.Exec([]byte(text), "nft", "-f", "-"); err != nil {
					t.Fatalf("%s: %v", f, err)
				}
				mustLoad(t, fromTx, text)
			}
			args := []string{"list", "ruleset"}
			if len(p.foreign) == 0 {
				args = []string{"list", "table", fromTx.Families()[0], TableName}
			}
			listing, err := ns.Exec(nil, "nft", args...)
			if err != nil {
				t.Fatal(err)
			}
			fromKernel := New()
			if err := fromKernel.Load(listing); err != nil {
				t.Fatalf("parsing nft %s: %v\n%s", strings.Join(args, " "), err, listing)
			}
			if diff := cmp.Diff(fromTx.Dump(), fromKernel.Dump()); diff != "" {
				t.Errorf("the kernel's listing differs from the transactions (-transactions +kernel):\n%s", diff)
			}
			if diff := cmp.Diff(p.foreign, fromKernel.Foreign()); diff != "" {
				t.Errorf("foreign tables (-want +got):\n%s", diff)
			}
			if *update {
				if err := os.WriteFile("testdata/"+p.listing, []byte(listing), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			saved := New()
			mustLoad(t, saved, readFile(t, p.listing))
			if diff := cmp.Diff(saved.Dump(), fromKernel.Dump()); diff != "" {
				t.Errorf("testdata/%s is stale (run with -update) (-saved +kernel):\n%s", p.listing, diff)
			}
		})
	}
}

// TestRuleShapesAgainstKernel checks the printed column of ruleShapes against what nft prints, and that
// the kernel's listing of every shape parses to the canonical form.
func TestRuleShapesAgainstKernel(t *testing.T) {
	for _, family := range []string{"ip", "ip6"} {
		t.Run(family, func(t *testing.T) {
			ns := netnstest.New(t)
			if _, err := ns.Exec([]byte(shapesTransaction(family)), "nft", "-f", "-"); err != nil {
				t.Fatal(err)
			}
			chain, err := ns.Exec(nil, "nft", "list", "chain", family, TableName, "shapes")
			if err != nil {
				t.Fatal(err)
			}
			var printed []string
			for _, l := range strings.Split(chain, "\n") {
				if strings.HasPrefix(l, "\t\t") {
					printed = append(printed, strings.TrimSpace(l))
				}
			}
			var wantPrinted, wantCanonical []string
			for _, s := range ruleShapes {
				if s.family != family {
					continue
				}
				wantPrinted = append(wantPrinted, s.printed)
				c := s.canonical
				if c == "" {
					c = s.written
				}
				wantCanonical = append(wantCanonical, c)
			}
			if diff := cmp.Diff(wantPrinted, printed); diff != "" {
				t.Errorf("nft prints the shapes differently (-ruleShapes +nft):\n%s", diff)
			}
			listing, err := ns.Exec(nil, "nft", "list", "table", family, TableName)
			if err != nil {
				t.Fatal(err)
			}
			ts := New()
			if err := ts.Load(listing); err != nil {
				t.Fatalf("%v\n%s", err, listing)
			}
			if diff := cmp.Diff(wantCanonical, ts.Rules(family, "shapes")); diff != "" {
				t.Errorf("the listing parses differently (-want +got):\n%s", diff)
			}
		})
	}
}
