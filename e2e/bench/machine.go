package main

import (
	"fmt"
	"strings"
)

// machineInfo describes the host and the binaries a report was measured with.
type machineInfo struct {
	CPUs     int
	CPUModel string
	MemoryGB float64
	Kernel   string
	IPTables string
	// NFT is what `nft --version` printed.
	NFT    string `json:",omitempty"`
	Go     string
	Commit string // git describe of the repository
	// Versions maps each implementation to what its binary's --version printed.
	Versions map[string]string
}

func (m machineInfo) oneLine() string {
	return fmt.Sprintf("%d CPUs (%s), %.1f GiB, kernel %s, %s, %s", m.CPUs, m.CPUModel, m.MemoryGB, m.Kernel,
		m.IPTables, m.Go)
}

func (m machineInfo) versions() string {
	var parts []string
	for _, impl := range []string{implOurs, implUpstream} {
		if v, ok := m.Versions[impl]; ok {
			parts = append(parts, impl+" "+v)
		}
	}
	return strings.Join(parts, "; ")
}
