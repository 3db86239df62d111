package ipvsvm

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Options describe one VM run.
type Options struct {
	// Agent is the static guest agent (e2e/ipvsvm/guest); Daemon an optional static kube-proxy binary.
	Agent, Daemon string
	// Params tell the agent what to run.
	Params Params
	// Files are extra files for the guest (path → content), e.g. the daemon's config and kubeconfig.
	Files map[string][]byte
	// Binaries are extra executables for the guest (guest path → host path), with the shared libraries
	// they need (upstream's kube-proxy, say).
	Binaries map[string]string
	// MemoryMB and CPUs size the VM (defaults 1024 and 2).
	MemoryMB, CPUs int
	// Timeout bounds the whole boot (default 5 min).
	Timeout time.Duration
	// Console, when set, receives every console line as it arrives (before OnLine).
	Console io.Writer
	// OnLine is called for every protocol line (without the prefix), e.g. to answer WAIT requests.
	OnLine func(line string)
	// WorkDir holds the initramfs and the console log (default: a new directory under CacheDir()/run).
	WorkDir string
	// Logf logs progress (may be nil).
	Logf func(format string, args ...any)
}

// CaseResult is one dataplane case's outcome.
type CaseResult struct {
	Name, Status, Detail string
}

// BenchResult is one benchmark figure.
type BenchResult struct {
	Name    string
	Seconds float64
	Detail  string
}

// Result is what a VM run reported.
type Result struct {
	Cases []CaseResult
	Bench []BenchResult
	Notes []string
	// Files are the files the agent sent (FILE lines), by name.
	Files map[string][]byte
	// Done is the agent's exit code, or -1 when it never said (crash, timeout).
	Done int
	// ConsoleLog is the path of the full console output.
	ConsoleLog string
	// Prepare and Boot are how long building the initramfs and running the VM took.
	Prepare, Boot time.Duration
}

// Run builds the initramfs for k and boots it under qemu (software emulation: TCG), streaming the
// console, until the guest powers off or the timeout passes. The returned error is for failing to run
// the VM at all; what the guest reports is in the Result.
func Run(ctx context.Context, k *Kernel, o Options) (*Result, error) {
	if o.MemoryMB == 0 {
		o.MemoryMB = 1024
	}
	if o.CPUs == 0 {
		o.CPUs = 2
	}
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Minute
	}
	logf := o.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if o.WorkDir == "" {
		base := filepath.Join(CacheDir(), "run")
		if err := os.MkdirAll(base, 0o755); err != nil {
			return nil, err
		}
		pruneRuns(base, 10)
		d, err := os.MkdirTemp(base, "vm-")
		if err != nil {
			return nil, err
		}
		o.WorkDir = d
	}
	res := &Result{Done: -1, ConsoleLog: filepath.Join(o.WorkDir, "console.log")}
	start := time.Now()
	params, err := json.Marshal(o.Params)
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{ParamsPath: params}
	for n, b := range o.Files {
		files[n] = b
	}
	initrd := filepath.Join(o.WorkDir, "initramfs.cpio")
	defer os.Remove(initrd) // tens of MB; the console log stays
	if err := buildInitramfs(initrd, k, o.Agent, o.Daemon, o.Binaries, files); err != nil {
		return nil, fmt.Errorf("building the initramfs: %w", err)
	}
	if st, err := os.Stat(initrd); err == nil {
		logf("initramfs %s: %d MB", initrd, st.Size()>>20)
	}
	res.Prepare = time.Since(start)
	if err := os.WriteFile(res.ConsoleLog, nil, 0o644); err != nil {
		return nil, err
	}

	// A TCG boot very rarely hangs before the guest prints anything (seen once in eight runs here:
	// an empty console for the whole timeout, where the first line normally comes after 9-15 s). Nothing
	// has reached the host then, so booting again is safe; the second boot prints the kernel's messages,
	// in case it hangs too.
	for attempt := 1; ; attempt++ {
		err := boot(ctx, k, o, initrd, res, attempt > 1)
		if !errors.Is(err, errSilent) || attempt == 2 {
			return res, err
		}
		logf("no console output %v after starting qemu; booting again with kernel messages on", silentBoot)
	}
}

// silentBoot is how long a boot may stay silent before it is given up: the init script's first line comes
// after a few seconds.
const silentBoot = 90 * time.Second

var errSilent = errors.New("the VM printed nothing")

// boot runs qemu once on the prepared initramfs, streaming the console into res.
func boot(ctx context.Context, k *Kernel, o Options, initrd string, res *Result, verbose bool) error {
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	kernelArgs := "console=ttyS0 panic=-1 quiet loglevel=3 mitigations=off"
	if verbose {
		kernelArgs = "console=ttyS0 panic=-1 mitigations=off"
	}
	// KVM here cannot run a stock kernel (see shared/reference/kernel-lab): software emulation, whose
	// multi-threaded mode uses both host cores.
	args := []string{
		"-accel", "tcg,thread=multi", "-cpu", "max", "-smp", strconv.Itoa(o.CPUs), "-m", strconv.Itoa(o.MemoryMB),
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot", "-serial", "stdio",
		"-kernel", k.Image, "-initrd", initrd,
		"-append", kernelArgs,
		// User networking: the guest reaches the host's loopback at 10.0.2.2.
		"-netdev", "user,id=n0", "-device", "virtio-net-pci,netdev=n0",
	}
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", args...)
	cmd.Stdin = nil
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return cmd.Process.Kill() }
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.Stderr = cmd.Stdout
	logFile, err := os.OpenFile(res.ConsoleLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logFile.Close()
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting qemu: %w", err)
	}
	var spoke atomic.Bool
	silence := time.AfterFunc(silentBoot, func() {
		if !spoke.Load() {
			cancel()
		}
	})
	defer silence.Stop()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64*1024), 1<<20)
		for sc.Scan() {
			spoke.Store(true)
			line := strings.TrimRight(sc.Text(), "\r")
			fmt.Fprintln(logFile, line)
			if o.Console != nil {
				fmt.Fprintln(o.Console, line)
			}
			i := strings.Index(line, Prefix)
			if i < 0 {
				continue
			}
			msg := line[i+len(Prefix):]
			res.record(msg)
			if o.OnLine != nil {
				o.OnLine(msg)
			}
		}
	}()
	wg.Wait()
	werr := cmd.Wait()
	res.Boot += time.Since(start)
	switch {
	case ctx.Err() != nil && !spoke.Load():
		return fmt.Errorf("%w for %v (console: %s)", errSilent, time.Since(start).Round(time.Second), res.ConsoleLog)
	case ctx.Err() != nil:
		return fmt.Errorf("the VM did not finish within %v (console: %s)", o.Timeout, res.ConsoleLog)
	case werr != nil && res.Done < 0:
		return fmt.Errorf("qemu: %w (console: %s)", werr, res.ConsoleLog)
	}
	return nil
}

// pruneRuns keeps the newest keep run directories under base.
func pruneRuns(base string, keep int) {
	ents, err := os.ReadDir(base)
	if err != nil {
		return
	}
	type run struct {
		path string
		mod  time.Time
	}
	var runs []run
	for _, e := range ents {
		if info, err := e.Info(); err == nil && e.IsDir() {
			runs = append(runs, run{filepath.Join(base, e.Name()), info.ModTime()})
		}
	}
	sort.Slice(runs, func(i, j int) bool { return runs[i].mod.After(runs[j].mod) })
	for i := keep; i < len(runs); i++ {
		_ = os.RemoveAll(runs[i].path)
	}
}

// record parses one protocol line.
func (r *Result) record(msg string) {
	kind, rest, _ := strings.Cut(msg, " ")
	switch kind {
	case "CASE":
		f := strings.SplitN(rest, " ", 3)
		if len(f) >= 2 {
			c := CaseResult{Name: f[0], Status: f[1]}
			if len(f) == 3 {
				c.Detail = f[2]
			}
			r.Cases = append(r.Cases, c)
		}
	case "BENCH":
		f := strings.SplitN(rest, " ", 3)
		if len(f) >= 2 {
			s, _ := strconv.ParseFloat(f[1], 64)
			b := BenchResult{Name: f[0], Seconds: s}
			if len(f) == 3 {
				b.Detail = f[2]
			}
			r.Bench = append(r.Bench, b)
		}
	case "NOTE":
		r.Notes = append(r.Notes, rest)
	case "FILE":
		name, chunk, _ := strings.Cut(rest, " ")
		if b, err := base64.StdEncoding.DecodeString(chunk); err == nil {
			if r.Files == nil {
				r.Files = map[string][]byte{}
			}
			r.Files[name] = append(r.Files[name], b...)
		}
	case "DONE":
		f := strings.Fields(rest)
		if len(f) > 0 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				r.Done = n
			}
		}
	}
}

// Case returns the result of a case by name.
func (r *Result) Case(name string) (CaseResult, bool) {
	for _, c := range r.Cases {
		if c.Name == name {
			return c, true
		}
	}
	return CaseResult{}, false
}
