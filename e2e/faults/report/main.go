// Command report renders the fault table's rows (JSON lines written by the e2e/faults tests through
// KP_FAULTS_ROWS) into docs/RELIABILITY.md: one table per run, the rows in the table's order, each
// with what was done, what failed, how long the node took to converge and what an operator sees.
//
//	go run ./e2e/faults/report -rows rows.jsonl -out docs/RELIABILITY.md -command 'make faults'
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"kube-proxy/e2e/faults"
)

func main() {
	rowsPath := flag.String("rows", "", "the rows file (JSON lines)")
	out := flag.String("out", "docs/RELIABILITY.md", "the document to write")
	command := flag.String("command", "make faults", "the command that measured the rows, for the document")
	flag.Parse()
	rows, err := read(*rowsPath)
	if err == nil && len(rows) == 0 {
		err = fmt.Errorf("%s holds no rows", *rowsPath)
	}
	if err == nil {
		err = os.WriteFile(*out, render(rows, *command), 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "report:", err)
		os.Exit(1)
	}
	fmt.Printf("wrote %d rows to %s\n", len(rows), *out)
}

func read(path string) ([]faults.Row, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var rows []faults.Row
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var r faults.Row
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		rows = append(rows, r)
	}
	return rows, sc.Err()
}

// cell makes text safe inside a Markdown table cell.
func cell(s string) string {
	return strings.NewReplacer("|", "\\|", "\n", " ").Replace(s)
}

func render(rows []faults.Row, command string) []byte {
	slices.SortStableFunc(rows, func(a, b faults.Row) int {
		if a.Order != b.Order {
			return a.Order - b.Order
		}
		return strings.Compare(a.Mode, b.Mode)
	})
	var b bytes.Buffer
	form := "short form (`make test`)"
	if rows[0].Long {
		form = "full durations and sizes (`make faults`)"
	}
	first, last := rows[0].When, rows[0].When
	for _, r := range rows {
		first, last = minTime(first, r.When), maxTime(last, r.When)
	}
	fmt.Fprintf(&b, "# Reliability: the fault table\n\n")
	fmt.Fprintf(&b, "Written by `go run ./e2e/faults/report` from the results of the e2e/faults tests (`%s`), not by hand.\n", command)
	fmt.Fprintf(&b, "Each row breaks one thing on a node running the daemon in network namespaces (a real kube-apiserver, real\n")
	fmt.Fprintf(&b, "kernel rules, connections flowing from a client to a cluster IP and a NodePort) and records what happened.\n")
	if slices.ContainsFunc(rows, func(r faults.Row) bool { return r.Mode == "ipvs" }) {
		fmt.Fprintf(&b, "Mode ipvs's rows run in a qemu VM booting Debian's stock kernel under software emulation (TCG: this host's\n")
		fmt.Fprintf(&b, "kernel has no IP_VS; e2e/ipvsvm's TestIPVSFaultsInVM), with the same traffic inside the VM: everything there\n")
		fmt.Fprintf(&b, "runs several times slower, so compare those rows with their own baseline.\n")
	}
	fmt.Fprintf(&b, "\n")
	fmt.Fprintf(&b, "- Measured %s – %s UTC, %s, on %d CPUs (%s/%s).\n", first.Format("2006-01-02 15:04"), last.Format("15:04"), form, runtime.NumCPU(), runtime.GOOS, runtime.GOARCH)
	fmt.Fprintf(&b, "- *Sent/failed*: connections to Services that existed before the fault, made while it lasted.\n")
	fmt.Fprintf(&b, "- *Converge*: how long the node took to be right again (what is timed is said in each cell).\n\n")
	fmt.Fprintf(&b, "| fault | mode | what the test does | sent / failed | converge | what the operator sees |\n")
	fmt.Fprintf(&b, "|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %d / %d | %s | %s |\n", cell(r.Fault), r.Mode, cell(r.Action), r.Sent, r.Failed,
			cell(orDash(r.Converge)), cell(r.Sees))
	}
	return b.Bytes()
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
