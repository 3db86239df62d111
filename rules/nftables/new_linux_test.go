package nftables

import "testing"

func TestAtLeast(t *testing.T) {
	for _, tc := range []struct {
		s    string
		want bool
	}{
		{"6.18.44-fc-v1147", true},
		{"5.13.0", true},
		{"5.12.19-generic", false},
		{"4.19.0", false},
		{"nftables v1.0.6 (Lester Gooch #5)", true},
		{"nftables v1.0.1 (Fearless Fosdick #3)", true},
		{"nftables v1.0.0 (Fearless Fosdick #2)", false},
		{"nftables v0.9.8 (E.D.S.)", false},
		{"garbage", false},
	} {
		major, minor, patch := 5, 13, 0
		if tc.s[0] == 'n' {
			major, minor, patch = 1, 0, 1
		}
		if got := atLeast(tc.s, major, minor, patch); got != tc.want {
			t.Errorf("atLeast(%q, %d.%d.%d) = %v, want %v", tc.s, major, minor, patch, got, tc.want)
		}
	}
}
