//go:build linux

package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	ipvslib "github.com/cloudflare/ipvs"
	"github.com/cloudflare/ipvs/netmask"

	"kube-proxy/e2e/ipvsvm"
	"kube-proxy/rules/ipvs"
)

// sideBySide measures each implementation in turn, p.Runs times, alternating their order: the same
// Services in the host's apiserver, the same observer (this agent reading the kernel's IPVS table).
// Per run and implementation it reports (BENCH lines named "<impl>/<figure>"):
//
//   - cold-start: exec → every benchmark Service's virtual server has exactly its real servers
//     (/proc/net/ip_vs read every 200 ms, or four times as long as reading it took);
//   - rss-mib: the process's VmRSS right after;
//   - settled: exec → the process is idle (under 5% of a CPU for a second), its first sync done;
//   - change: one Service's EndpointSlice changed by the host (asked for with "WAIT bench-change i gen")
//     → that virtual server has exactly the new real servers (read over netlink every 5 ms); the median
//     and the largest of the run, which include the console round trip to the host, the same for all;
//   - cpu-per-change: the process's CPU time over the changes, divided by their number;
//   - idle-cpu: the process's CPU time over p.Idle with nothing changing (one periodic full resync when
//     p.Idle is longer than ipvs.syncPeriod);
//   - rss-mib-idle: the median of the process's VmRSS read every second over p.Idle (the steady state).
func sideBySide(p *ipvsvm.SideBySideParams) error {
	if err := hostNetwork(); err != nil {
		return err
	}
	idle, err := time.ParseDuration(p.Idle)
	if err != nil {
		return fmt.Errorf("idle: %w", err)
	}
	gens := map[int]int{}
	for run := 1; run <= p.Runs; run++ {
		impls := slices.Clone(p.Impls)
		if run%2 == 0 {
			slices.Reverse(impls)
		}
		for _, impl := range impls {
			if err := measure(impl, run, p, idle, gens); err != nil {
				return fmt.Errorf("%s, run %d: %w", impl.Name, run, err)
			}
		}
	}
	return nil
}

var hostNet struct {
	once sync.Once
	err  error
}

// hostNetwork gives the VM its address on qemu's user network, through which the host's apiserver is
// 10.0.2.2.
func hostNetwork() error {
	hostNet.once.Do(func() {
		for _, c := range [][]string{
			{"ip", "link", "set", "eth0", "up"},
			{"ip", "addr", "add", "10.0.2.15/24", "dev", "eth0"},
			{"ip", "route", "add", "default", "via", "10.0.2.2"},
		} {
			if hostNet.err = sh(c...); hostNet.err != nil {
				return
			}
		}
	})
	return hostNet.err
}

func measure(impl ipvsvm.BenchImpl, run int, p *ipvsvm.SideBySideParams, idle time.Duration, gens map[int]int) error {
	if err := ipvs.Cleanup(context.Background()); err != nil {
		return fmt.Errorf("cleaning up before: %w", err)
	}
	if err := reloadIPVS(); err != nil {
		return err
	}
	want := func(i int) []string {
		var out []string
		for _, a := range ipvsvm.BenchEndpoints(i, gens[i]) {
			out = append(out, netip.AddrPortFrom(a, ipvsvm.BenchTargetPort).String())
		}
		sort.Strings(out)
		return out
	}
	tag := fmt.Sprintf("run=%d services=%d", run, p.Services)
	t0 := time.Now()
	proc, err := startDaemon(fmt.Sprintf("bench-%s-%d", impl.Name, run), false, impl.Args...) // quiet: the console would slow a chatty daemon down
	if err != nil {
		return err
	}
	defer os.Remove(proc.LogPath) // the guest's files are in its memory
	defer stopDaemon(proc)
	pid := proc.PID()
	profile := func(name string, d time.Duration) func() {
		if p.Profile == "" || impl.Name != "ours" {
			return func() {}
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := sendProfile(fmt.Sprintf("ours-%s-%d.pprof", name, run), d); err != nil {
				logf("profile %s: %v", name, err)
			}
		}()
		return func() { <-done }
	}
	coldFor, err := time.ParseDuration(p.Profile)
	if p.Profile != "" && err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	waitCold := profile("cold", coldFor)

	// Cold start. Reading a big table costs the guest's CPUs too: the observer sleeps four times as long
	// as its last look took (200 ms at least), so it takes at most a fifth of one CPU from the daemon.
	var missing int
	var look, longest time.Duration
	err = waitDuty(15*time.Minute, func() error {
		start := time.Now()
		defer func() {
			look = time.Since(start)
			longest = max(longest, look)
		}()
		if proc.Exited() {
			return errStop{fmt.Errorf("exited: %s", lastLines(proc))}
		}
		table, err := readProcIPVS()
		if err != nil {
			return err
		}
		missing = 0
		for i := 0; i < p.Services; i++ {
			vs := netip.AddrPortFrom(ipvsvm.BenchClusterIP(i), ipvsvm.BenchPort).String()
			if !slices.Equal(table[vs], want(i)) {
				missing++
			}
		}
		if missing > 0 {
			return fmt.Errorf("%d of %d virtual servers not as wanted", missing, p.Services)
		}
		return nil
	}, func() time.Duration { return max(200*time.Millisecond, 4*look) })
	if err != nil {
		return fmt.Errorf("cold start: %w; the daemon's last lines: %s", err, lastLines(proc))
	}
	report("BENCH", impl.Name+"/cold-start", secs(time.Since(t0)), fmt.Sprintf("%s (the longest look at the table took %s)", tag, secs(longest)))
	rss, err := vmRSS(pid)
	if err != nil {
		return err
	}
	report("BENCH", impl.Name+"/rss-mib", fmt.Sprintf("%.1f", rss), tag+" after the cold start"+rssParts(pid))
	heap := func(name string) {
		if p.Profile != "" && impl.Name == "ours" {
			if err := sendPprof(fmt.Sprintf("ours-heap-%s-%d.pprof", name, run), "heap"); err != nil {
				logf("heap profile %s: %v", name, err)
			}
		}
	}
	heap("cold")
	// The first sync may go on after the virtual servers are complete (upstream's does, for long): wait
	// until the process is idle, so that the changes measure changes, not the end of the first sync.
	// Upstream's first sync at 10,000 Services goes on for over ten minutes under TCG.
	if err := waitIdle(pid, 15*time.Minute+time.Duration(p.Services)*200*time.Millisecond); err != nil {
		return fmt.Errorf("after the cold start: %w; the daemon's last lines: %s", err, lastLines(proc))
	}
	report("BENCH", impl.Name+"/settled", secs(time.Since(t0)), tag+": exec -> idle after the first sync")
	if rss, err := vmRSS(pid); err == nil {
		report("BENCH", impl.Name+"/rss-mib-settled", fmt.Sprintf("%.1f", rss), tag+" once idle after the first sync"+rssParts(pid))
	}
	waitCold()

	// One-Service changes.
	c, err := ipvslib.New()
	if err != nil {
		return err
	}
	cpu0, err := cpuTime(pid)
	if err != nil {
		return err
	}
	var lat []time.Duration
	for k := 0; k < p.Changes; k++ {
		i := (k*7919 + run*104729) % p.Services
		gens[i]++
		svc := ipvslib.Service{Address: ipvsvm.BenchClusterIP(i), Port: ipvsvm.BenchPort, Protocol: ipvslib.TCP,
			Family: ipvslib.INET, Netmask: netmask.MaskFrom(32, 32)}
		t := time.Now()
		report("WAIT", "bench-change", i, gens[i])
		err := waitEvery(5*time.Minute, 5*time.Millisecond, func() error {
			if proc.Exited() {
				return errStop{fmt.Errorf("exited: %s", lastLines(proc))}
			}
			ds, err := c.Destinations(svc)
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
			var got []string
			for _, d := range ds {
				if d.Weight > 0 {
					got = append(got, netip.AddrPortFrom(d.Address, d.Port).String())
				}
			}
			sort.Strings(got)
			if !slices.Equal(got, want(i)) {
				return fmt.Errorf("real servers %v, want %v", got, want(i))
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("change %d (Service %d): %w; the daemon's last lines: %s", k+1, i, err, lastLines(proc))
		}
		lat = append(lat, time.Since(t))
		time.Sleep(200 * time.Millisecond)
	}
	cpu1, err := cpuTime(pid)
	if err != nil {
		return err
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		report("BENCH", impl.Name+"/change", secs(lat[len(lat)/2]), fmt.Sprintf("%s median of %d, min %s max %s", tag, len(lat),
			secs(lat[0]), secs(lat[len(lat)-1])))
		report("BENCH", impl.Name+"/cpu-per-change", secs((cpu1-cpu0)/time.Duration(len(lat))), tag)
	}

	// Nothing changes for idle; the RSS is read every second meanwhile. A Go process's RSS moves with its
	// collections and with what the periodic resync allocates, so one reading at an arbitrary moment says
	// little: the median of these is the steady state.
	waitIdleProfile := profile("idle", idle-time.Second)
	var samples []float64
	for end := time.Now().Add(idle); time.Now().Before(end); {
		time.Sleep(min(time.Second, time.Until(end)))
		if rss, err := vmRSS(pid); err == nil {
			samples = append(samples, rss)
		}
	}
	waitIdleProfile()
	if len(samples) > 0 {
		slices.Sort(samples)
		report("BENCH", impl.Name+"/rss-mib-idle", fmt.Sprintf("%.1f", samples[len(samples)/2]),
			fmt.Sprintf("%s median of %d readings, one a second over the idle period, min %.1f max %.1f", tag, len(samples),
				samples[0], samples[len(samples)-1]))
	}
	cpu2, err := cpuTime(pid)
	if err != nil {
		return err
	}
	report("BENCH", impl.Name+"/idle-cpu", secs(cpu2-cpu1), fmt.Sprintf("%s over %s", tag, idle))
	if rss, err := vmRSS(pid); err == nil {
		report("BENCH", impl.Name+"/rss-mib-end", fmt.Sprintf("%.1f", rss), tag+" after the changes and the idle period"+rssParts(pid))
	}
	if hwm, err := procStatusMiB(pid, "VmHWM:"); err == nil {
		report("BENCH", impl.Name+"/rss-mib-peak", fmt.Sprintf("%.1f", hwm), tag+" the largest RSS of the run (VmHWM)")
	}
	heap("end")
	stopDaemon(proc)
	return nil
}

// reloadIPVS unloads the IPVS modules and loads ip_vs and ip_vs_rr again, so that every start meets an
// IPVS that never held anything. The kernel keeps deleted real servers in a trash for one to three
// minutes and walks the whole trash for every real server added: right after the cleanup of 30,000 real
// servers, adding as many took four times as long (the profile of ours' cold start at 10,000 Services had
// 61% of its CPU time in the sendmsg of CreateDestination).
func reloadIPVS() error {
	b, err := os.ReadFile("/proc/modules")
	if err != nil {
		return err
	}
	var mods []string
	for _, l := range strings.Split(string(b), "\n") {
		name, _, _ := strings.Cut(l, " ")
		if strings.HasPrefix(name, "ip_vs_") || name == "xt_ipvs" {
			mods = append(mods, name)
		}
	}
	for _, m := range append(mods, "ip_vs") {
		if err := sh("rmmod", m); err != nil {
			return fmt.Errorf("reloading IPVS: %w", err)
		}
	}
	for _, m := range []string{"ip_vs", "ip_vs_rr"} {
		if err := sh("modprobe", m); err != nil {
			return fmt.Errorf("reloading IPVS: %w", err)
		}
	}
	return nil
}

// sendProfile takes a CPU profile of ours for d, from the moment its profiling server answers, and sends
// it to the host as FILE lines.
func sendProfile(name string, d time.Duration) error {
	return sendPprof(name, "profile?seconds="+strconv.Itoa(int(d.Seconds())))
}

// sendPprof fetches /debug/pprof/<what> from ours and sends it to the host as FILE lines.
func sendPprof(name, what string) error {
	url := "http://127.0.0.1:10249/debug/pprof/" + what
	var resp *http.Response
	err := waitEvery(2*time.Minute, 20*time.Millisecond, func() error {
		r, err := http.Get(url)
		if err == nil {
			resp = r
		}
		return err
	})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	s := base64.StdEncoding.EncodeToString(b)
	for len(s) > 0 {
		n := min(len(s), 3000)
		report("FILE", name, s[:n])
		s = s[n:]
	}
	return nil
}

// waitIdle waits until the process used less than 5% of a CPU over a whole second.
func waitIdle(pid int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	last, err := cpuTime(pid)
	if err != nil {
		return err
	}
	for time.Now().Before(deadline) {
		time.Sleep(time.Second)
		cur, err := cpuTime(pid)
		if err != nil {
			return err
		}
		if cur-last < 50*time.Millisecond {
			return nil
		}
		last = cur
	}
	return fmt.Errorf("still busy after %v", limit)
}

func secs(d time.Duration) string { return fmt.Sprintf("%.3f", d.Seconds()) }

// waitDuty is waitEvery with an interval that next computes after each try.
func waitDuty(limit time.Duration, f func() error, next func() time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		err := f()
		if err == nil {
			return nil
		}
		var stop errStop
		if errors.As(err, &stop) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(next())
	}
}

// waitEvery is waitFor with a polling interval.
func waitEvery(limit, every time.Duration, f func() error) error {
	deadline := time.Now().Add(limit)
	for {
		err := f()
		if err == nil {
			return nil
		}
		var stop errStop
		if errors.As(err, &stop) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(every)
	}
}

// readProcIPVS reads the IPv4 TCP virtual servers of /proc/net/ip_vs with their real servers of
// weight > 0, sorted ("10.96.128.0:80" → ["10.200.0.1:8080", ...]).
func readProcIPVS() (map[string][]string, error) {
	f, err := os.Open("/proc/net/ip_vs")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string][]string{}
	var cur string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		switch {
		case len(fs) >= 2 && fs[0] == "TCP":
			cur = hexAddrPort(fs[1])
			if cur != "" {
				out[cur] = []string{}
			}
		case len(fs) >= 4 && fs[0] == "->" && cur != "":
			if w, err := strconv.Atoi(fs[3]); err == nil && w > 0 {
				if r := hexAddrPort(fs[1]); r != "" {
					out[cur] = append(out[cur], r)
				}
			}
		case len(fs) >= 1 && (fs[0] == "UDP" || fs[0] == "SCTP" || fs[0] == "FWM"):
			cur = ""
		}
	}
	for k := range out {
		sort.Strings(out[k])
	}
	return out, sc.Err()
}

// hexAddrPort turns /proc/net/ip_vs' "0A608000:0050" into "10.96.128.0:80" ("" for other shapes).
func hexAddrPort(s string) string {
	a, p, ok := strings.Cut(s, ":")
	if !ok || len(a) != 8 {
		return ""
	}
	b, err := hex.DecodeString(a)
	if err != nil {
		return ""
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return ""
	}
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte(b)), uint16(port)).String()
}

// cpuTime is a process's user + system CPU time.
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The fields after the command name (which may hold spaces) start after its closing parenthesis.
	s := string(b)
	fs := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fs) < 13 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	utime, err1 := strconv.ParseInt(fs[11], 10, 64)
	stime, err2 := strconv.ParseInt(fs[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	const hz = 100 // USER_HZ
	return time.Duration(utime+stime) * time.Second / hz, nil
}

// vmRSS is a process's resident set size in MiB.
func vmRSS(pid int) (float64, error) { return procStatusMiB(pid, "VmRSS:") }

// rssParts says how much of the RSS is anonymous memory (the heap, stacks) and how much the executable's
// pages, which are shared memory here (the guest runs binaries from its initramfs) or file pages.
func rssParts(pid int) string {
	anon, err1 := procStatusMiB(pid, "RssAnon:")
	file, err2 := procStatusMiB(pid, "RssFile:")
	shmem, err3 := procStatusMiB(pid, "RssShmem:")
	if err1 != nil || err2 != nil || err3 != nil {
		return ""
	}
	return fmt.Sprintf(" (anonymous %.1f, executable and libraries %.1f)", anon, file+shmem)
}

// procStatusMiB reads one of the memory figures of /proc/<pid>/status (VmRSS:, VmHWM:) in MiB.
func procStatusMiB(pid int, field string) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field); ok {
			kb, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			if err != nil {
				return 0, err
			}
			return float64(kb) / 1024, nil
		}
	}
	return 0, fmt.Errorf("no %s for %d", field, pid)
}
