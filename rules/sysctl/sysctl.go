// Package sysctl reads and writes kernel parameters under /proc/sys, in the network namespace of the
// calling process (per-namespace parameters stay inside it).
package sysctl

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Root is where the parameters live; tests point it elsewhere.
var Root = "/proc/sys"

func path(name string) string {
	return filepath.Join(Root, strings.ReplaceAll(name, ".", "/"))
}

// Get reads an integer parameter such as "net/ipv4/conf/all/route_localnet".
func Get(name string) (int, error) {
	b, err := os.ReadFile(path(name))
	if err != nil {
		return 0, fmt.Errorf("reading sysctl %s: %w", name, err)
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("reading sysctl %s: %w", name, err)
	}
	return v, nil
}

// Set writes an integer parameter unless it already has that value.
func Set(name string, value int) error {
	if cur, err := Get(name); err == nil && cur == value {
		return nil
	}
	if err := os.WriteFile(path(name), []byte(strconv.Itoa(value)), 0o644); err != nil {
		return fmt.Errorf("setting sysctl %s=%d: %w", name, value, err)
	}
	return nil
}
