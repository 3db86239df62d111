package conntrack

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

const hashsizeFile = "/sys/module/nf_conntrack/parameters/hashsize"

// raiseHashsize grows the conntrack hash table to at least n buckets.
func raiseHashsize(n int) error {
	b, err := os.ReadFile(hashsizeFile)
	if err != nil {
		return fmt.Errorf("reading conntrack hashsize: %w", err)
	}
	cur, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || cur >= n {
		return nil
	}
	if err := os.WriteFile(hashsizeFile, []byte(strconv.Itoa(n)), 0o644); err != nil {
		return fmt.Errorf("setting conntrack hashsize %d: %w", n, err)
	}
	return nil
}
