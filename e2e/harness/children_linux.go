package harness

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ProcInfo describes a running process, as /proc shows it.
type ProcInfo struct {
	PID, PPID int
	// Args is the command line.
	Args []string
}

// Children returns the running processes whose parent is pid, read from /proc (processes that exit
// while it reads are skipped).
func Children(pid int) []ProcInfo {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []ProcInfo
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ppid, ok := parentOf(child)
		if !ok || ppid != pid {
			continue
		}
		out = append(out, ProcInfo{PID: child, PPID: ppid, Args: cmdline(child)})
	}
	return out
}

// ProcAlive reports whether a process with this PID exists and is not a zombie.
func ProcAlive(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	state := b[i+2]
	return state != 'Z' && state != 'X'
}

// parentOf reads the parent PID from /proc/<pid>/stat ("pid (comm) state ppid ...", comm may hold
// spaces and parentheses, so the fields are read after its last ')').
func parentOf(pid int) (int, bool) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0, false
	}
	ppid, err := strconv.Atoi(f[1])
	return ppid, err == nil
}

func cmdline(pid int) []string {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return nil
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}
