//go:build linux

// Command guest is the agent the IPVS VM tests run inside the VM (as the child of /init): it makes pod and
// client namespaces, drives rules/ipvs through scenarios with real traffic, runs the sync benchmark and
// the daemon part and the fault table's rows (faults.go), and reports on the console with the protocol
// of package ipvsvm.
//
//	guest run                 everything /kp/params.json asks for
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"kube-proxy/e2e/ipvsvm"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: guest run")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "run":
		os.Exit(run())
	default:
		fmt.Fprintln(os.Stderr, "unknown mode", os.Args[1])
		os.Exit(2)
	}
}

func report(kind string, args ...any) {
	parts := make([]string, 0, len(args))
	for _, a := range args {
		parts = append(parts, strings.ReplaceAll(fmt.Sprint(a), "\n", " | "))
	}
	fmt.Printf("%s%s %s\n", ipvsvm.Prefix, kind, strings.Join(parts, " "))
}

func logf(format string, args ...any) {
	fmt.Printf("guest: "+format+"\n", args...)
}

func run() int {
	b, err := os.ReadFile(ipvsvm.ParamsPath)
	if err != nil {
		report("DONE", 1, err)
		return 1
	}
	var p ipvsvm.Params
	if err := json.Unmarshal(b, &p); err != nil {
		report("DONE", 1, err)
		return 1
	}
	start := time.Now()
	if err := setupNetwork(4); err != nil {
		report("CASE", "setup", "FAIL", err)
		report("DONE", 1)
		return 1
	}
	logf("network ready in %v", time.Since(start).Round(time.Millisecond))
	rc := 0
	if len(p.Cases) > 0 || (p.Bench == 0 && p.Daemon == nil && p.SideBySide == nil && p.Faults == nil) {
		if !runCases(p.Cases) {
			rc = 1
		}
	}
	if p.Bench > 0 {
		if err := bench(p.Bench); err != nil {
			report("CASE", "bench", "FAIL", err)
			rc = 1
		}
	}
	if p.SideBySide != nil {
		if err := sideBySide(p.SideBySide); err != nil {
			report("CASE", "sidebyside", "FAIL", err)
			rc = 1
		} else {
			report("CASE", "sidebyside", "PASS", fmt.Sprintf("%d Services, %d runs", p.SideBySide.Services, p.SideBySide.Runs))
		}
	}
	if p.Daemon != nil {
		if err := daemonCase(p.Daemon); err != nil {
			report("CASE", "daemon", "FAIL", err)
			rc = 1
		} else {
			report("CASE", "daemon", "PASS", "with the kube-proxy binary")
		}
	}
	if p.Faults != nil && !faultRows(p.Faults) {
		rc = 1
	}
	report("DONE", rc)
	return rc
}

// runCases runs the named dataplane cases (all when names is empty) against one dataplane per family.
func runCases(names []string) bool {
	if len(names) == 0 || slices.Contains(names, "all") {
		names = ipvsvm.CaseNames
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e, err := newEnv(ctx)
	if err != nil {
		report("CASE", "dataplane", "FAIL", err)
		return false
	}
	ok := true
	for _, name := range names {
		c, found := cases[name]
		if !found {
			report("CASE", name, "FAIL", "unknown case")
			ok = false
			continue
		}
		start := time.Now()
		err := func() (err error) {
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("panic: %v", r)
				}
			}()
			return c(e)
		}()
		took := time.Since(start).Round(time.Millisecond)
		if err != nil {
			ok = false
			report("CASE", name, "FAIL", fmt.Sprintf("(%v) %v", took, err))
			if out, _ := shOut("ipvsadm", "-Ln"); out != "" {
				logf("ipvsadm -Ln after %s:\n%s", name, out)
			}
			continue
		}
		report("CASE", name, "PASS", fmt.Sprintf("(%v) %s", took, e.detail))
		e.detail = ""
	}
	return ok
}
