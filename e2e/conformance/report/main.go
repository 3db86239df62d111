// Command report writes docs/CONFORMANCE.md from a results directory of `make conformance`
// (e2e/conformance), so the document can be rewritten without running the tests again.
package main

import (
	"flag"
	"fmt"
	"os"

	"kube-proxy/e2e/conformance/results"
)

func main() {
	dir := flag.String("results", "", "results directory written by make conformance (bin/conformance/<time>)")
	out := flag.String("out", "docs/CONFORMANCE.md", "document to write")
	flag.Parse()
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "report: -results is required")
		os.Exit(2)
	}
	if err := results.WriteDocument(*dir, *out); err != nil {
		fmt.Fprintln(os.Stderr, "report:", err)
		os.Exit(1)
	}
}
