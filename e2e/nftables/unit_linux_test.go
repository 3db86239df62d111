package nftables

import "testing"

// TestLineDiff checks the diff the table comparisons print: the lines only in the first text with "-",
// those only in the second with "+", two lines of context, "..." between distant hunks.
func TestLineDiff(t *testing.T) {
	a := "1\n2\n3\n4\n5\n6\n7\n8\n9"
	b := "1\n2\nthree\n4\n5\n6\n7\n8\n9\n10"
	want := "  1\n  2\n- 3\n+ three\n  4\n  5\n  ...\n  8\n  9\n+ 10\n"
	if got := lineDiff(a, b); got != want {
		t.Errorf("lineDiff:\n%s\nwant:\n%s", got, want)
	}
	if got := lineDiff(a, a); got != "" {
		t.Errorf("lineDiff of equal texts: %q", got)
	}
}

// TestHashed pins upstream's naming of per-Service chains to a name upstream kube-proxy v1.37.2 wrote
// (TestUpstreamHandover compares whole tables; this checks the scheme the tests' names come from).
func TestHashed(t *testing.T) {
	if got, want := hashed("nft-2zd8j/web/tcp/tcp"), "KA7TG4LQ-nft-2zd8j/web/tcp/tcp"; got != want {
		t.Errorf("hashed = %q, want %q", got, want)
	}
}
