package main

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTick is USER_HZ, the unit of the times in /proc/PID/stat (100 on every Linux architecture Go
// supports).
const clockTick = 10 * time.Millisecond

// readCPU reads utime, stime, cutime and cstime of pid from /proc/PID/stat.
func readCPU(pid int) (cpuTimes, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return cpuTimes{}, fmt.Errorf("reading CPU times of %d: %w", pid, err)
	}
	// Fields after the command name (which may hold spaces) start at field 3, "state".
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return cpuTimes{}, fmt.Errorf("parsing /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 15 {
		return cpuTimes{}, fmt.Errorf("parsing /proc/%d/stat: %d fields", pid, len(f))
	}
	var v [4]int64
	for k := range v { // utime, stime, cutime, cstime are fields 14–17, i.e. f[11:15]
		if v[k], err = strconv.ParseInt(f[11+k], 10, 64); err != nil {
			return cpuTimes{}, fmt.Errorf("parsing /proc/%d/stat: %w", pid, err)
		}
	}
	return cpuTimes{Self: time.Duration(v[0]+v[1]) * clockTick, Children: time.Duration(v[2]+v[3]) * clockTick}, nil
}

// readMemory reads VmRSS and VmHWM of pid from /proc/PID/status.
func readMemory(pid int) (memory, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return memory{}, fmt.Errorf("reading memory of %d: %w", pid, err)
	}
	defer f.Close()
	var m memory
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		var dst *int64
		switch k {
		case "VmRSS":
			dst = &m.RSS
		case "VmHWM":
			dst = &m.HWM
		default:
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			return memory{}, fmt.Errorf("parsing %s of %d: %w", k, pid, err)
		}
		*dst = kb * 1024
	}
	if m.RSS == 0 {
		return m, fmt.Errorf("no VmRSS for %d", pid)
	}
	return m, sc.Err()
}

// hostBusy returns the fraction of the host's CPU time spent busy (neither idle nor waiting for I/O) over
// interval.
func hostBusy(interval time.Duration) (float64, error) {
	a, err := readHostCPU()
	if err != nil {
		return 0, err
	}
	time.Sleep(interval)
	b, err := readHostCPU()
	if err != nil {
		return 0, err
	}
	total, idle := b[0]-a[0], b[1]-a[1]
	if total <= 0 {
		return 0, nil
	}
	return float64(total-idle) / float64(total), nil
}

// readHostCPU returns the total and idle (idle + iowait) jiffies of the first line of /proc/stat.
func readHostCPU() ([2]int64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return [2]int64{}, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	var total, idle int64
	for k, s := range f[1:] {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return [2]int64{}, fmt.Errorf("parsing /proc/stat: %w", err)
		}
		if k == 7 || k == 8 { // steal, guest: not ours to count
			continue
		}
		total += v
		if k == 3 || k == 4 {
			idle += v
		}
	}
	return [2]int64{total, idle}, nil
}

// quiesce waits (at most max) until the host is mostly idle, e.g. while the kernel tears down a network
// namespace holding 100k rules, so that one measurement does not pay for the previous one's cleanup. It
// returns how long it waited and the last busy fraction seen.
func quiesce(max time.Duration) (time.Duration, float64) {
	start := time.Now()
	var busy float64
	for time.Since(start) < max {
		var err error
		if busy, err = hostBusy(250 * time.Millisecond); err != nil || busy < 0.2 {
			break
		}
	}
	return time.Since(start), busy
}

// waitReaped waits (at most max) until process pid is gone from /proc, i.e. reaped by its parent.
func waitReaped(pid int, max time.Duration) {
	if pid <= 0 {
		return
	}
	deadline := time.Now().Add(max)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); os.IsNotExist(err) {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// threadOf reports whether tid is a thread of process pid (pid itself included), as /proc says while
// the thread exists.
func threadOf(tid, pid int) bool {
	if tid == pid {
		return true
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", tid))
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Tgid:"); ok {
			return strings.TrimSpace(v) == strconv.Itoa(pid)
		}
	}
	return false
}
