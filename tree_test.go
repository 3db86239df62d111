package main

import (
	"bytes"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// trackedFiles lists the repository's tracked files (paths relative to its root), or skips the test
// outside a git checkout (a source tarball).
func trackedFiles(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("git", "ls-files", "-z").Output()
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	var files []string
	for _, f := range bytes.Split(bytes.TrimRight(out, "\x00"), []byte{0}) {
		if len(f) > 0 {
			files = append(files, string(f))
		}
	}
	return files
}

// notLinux matches a build constraint that selects systems other than Linux.
var notLinux = regexp.MustCompile(`(?m)^//go:build .*!linux`)

// TestLinuxOnly keeps the promise the tree makes: kube-proxy builds for Linux only (its nftables
// dependencies, knftables and google/nftables, do not build elsewhere), so no file may offer a stub for
// other systems, and no file may be named for one. Editors on other systems set GOOS=linux.
func TestLinuxOnly(t *testing.T) {
	for _, f := range trackedFiles(t) {
		if !strings.HasSuffix(f, ".go") {
			continue
		}
		if strings.HasSuffix(strings.TrimSuffix(f, "_test.go"), "_other") ||
			strings.HasSuffix(strings.TrimSuffix(f, ".go"), "_other") {
			t.Errorf("%s: a file for systems other than Linux; the project builds on Linux only", f)
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if notLinux.Match(src) {
			t.Errorf("%s: a build constraint for systems other than Linux; the project builds on Linux only", f)
		}
	}
}
