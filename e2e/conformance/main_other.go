//go:build !linux

package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "conformance: Linux only (network namespaces, cgroups, containerd)")
	os.Exit(1)
}
