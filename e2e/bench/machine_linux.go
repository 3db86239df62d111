package main

import (
	"bufio"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// describeMachine gathers machineInfo; what cannot be read is left empty.
func describeMachine(bins map[string]string) machineInfo {
	m := machineInfo{CPUs: runtime.NumCPU(), Go: runtime.Version(), Versions: map[string]string{}}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "MemTotal:" {
				kb, _ := strconv.ParseFloat(f[1], 64)
				m.MemoryGB = kb / (1 << 20)
			}
		}
	}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	m.IPTables = firstLine("iptables-nft", "--version")
	m.NFT = firstLine("nft", "--version")
	m.Commit = firstLine("git", "describe", "--always", "--dirty")
	for impl, bin := range bins {
		m.Versions[impl] = firstLine(bin, "--version")
	}
	return m
}

func firstLine(name string, args ...string) string {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return ""
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return line
}
