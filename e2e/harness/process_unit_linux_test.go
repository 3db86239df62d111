package harness

import (
	"strings"
	"testing"
)

func TestTail(t *testing.T) {
	tests := []struct {
		in   string
		n    int
		want string
	}{
		{"a\nb\nc\n", 2, "b\nc"},
		{"a\nb", 5, "a\nb"},
		{"", 3, ""},
		{strings.Repeat("x\n", 100) + "y\nz\n", 2, "y\nz"},
	}
	for _, tt := range tests {
		if got := tail(tt.in, tt.n); got != tt.want {
			t.Errorf("tail(%q, %d) = %q, want %q", tt.in, tt.n, got, tt.want)
		}
	}
}
