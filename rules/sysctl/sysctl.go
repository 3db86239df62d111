// Package sysctl reads and writes kernel parameters under /proc/sys, in the network namespace of the
// calling process (per-namespace parameters stay inside it). A Tree is one directory of parameters:
// Proc in production, a test's own directory in tests. Modes take a Tree; the package-level Get and Set
// use the Tree at Root, for callers not converted yet.
package sysctl

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Tree is the kernel parameters under one directory.
type Tree struct {
	root string
}

// At returns the parameters under root.
func At(root string) Tree { return Tree{root: root} }

// Proc is /proc/sys of the calling process's network namespace.
var Proc = At("/proc/sys")

func (t Tree) path(name string) string {
	return filepath.Join(t.root, strings.ReplaceAll(name, ".", "/"))
}

// Get reads an integer parameter such as "net/ipv4/conf/all/route_localnet" (or with dots).
func (t Tree) Get(name string) (int, error) {
	b, err := os.ReadFile(t.path(name))
	if err != nil {
		return 0, fmt.Errorf("reading sysctl %s: %w", name, err)
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("reading sysctl %s: %w", name, err)
	}
	return v, nil
}

// Set writes an integer parameter unless it already has that value. It reports whether it wrote.
func (t Tree) Set(name string, value int) (bool, error) {
	if cur, err := t.Get(name); err == nil && cur == value {
		return false, nil
	}
	// Without O_CREATE: a parameter the kernel does not have is an error, in a test's tree too.
	f, err := os.OpenFile(t.path(name), os.O_WRONLY|os.O_TRUNC, 0)
	if err == nil {
		_, err = f.WriteString(strconv.Itoa(value))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return false, fmt.Errorf("setting sysctl %s=%d: %w", name, value, err)
	}
	return true, nil
}

// Root is where the package-level Get and Set look; tests point it elsewhere.
var Root = "/proc/sys"

// Get reads an integer parameter under Root (see Tree.Get).
func Get(name string) (int, error) { return At(Root).Get(name) }

// Set writes an integer parameter under Root unless it already has that value (see Tree.Set).
func Set(name string, value int) error {
	_, err := At(Root).Set(name, value)
	return err
}
