package xtables

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// TestUsableRunnerNamesWhatIsMissing: a family whose tools are not all installed (ip6tables-nft-save
// missing, say) is refused with a message naming the backend and family, so the caller runs single-stack.
func TestUsableRunnerNamesWhatIsMissing(t *testing.T) {
	dir := t.TempDir()
	for _, tool := range []string{"ip6tables-nft", "ip6tables-nft-restore"} { // no ip6tables-nft-save
		if err := os.WriteFile(filepath.Join(dir, tool), []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", dir)
	if Available(BackendNFT, v1.IPv6Protocol) {
		t.Fatal("Available with ip6tables-nft-save missing")
	}
	_, err := UsableRunner(BackendNFT, v1.IPv6Protocol)
	if err == nil || !strings.Contains(err.Error(), "nft tools for IPv6 are not installed") {
		t.Fatalf("UsableRunner = %v, want an error naming nft and IPv6", err)
	}
}
