package inspect

import (
	"context"
	"fmt"
	"io"
)

// DoctorReport is doctor's result, as --json prints it.
type DoctorReport struct {
	Findings []Finding `json:"findings"`
	Problems int       `json:"problems"`
}

func runDoctor(ctx context.Context, env *Env, out *printer, stderr io.Writer) int {
	live, err := ReadLive(ctx)
	if err != nil {
		fmt.Fprintln(stderr, "kube-proxy doctor:", err)
		return exitFinding
	}
	rep := &DoctorReport{Findings: Doctor(ctx, env, live)}
	for _, f := range rep.Findings {
		if f.Status == "problem" {
			rep.Problems++
		}
		mark := map[string]string{"ok": "ok     ", "problem": "PROBLEM", "warning": "warning", "skipped": "skipped"}[f.Status]
		out.printf("%s %s: %s\n", mark, f.Check, f.What)
		if f.Status != "ok" {
			if f.Why != "" {
				out.printf("        why: %s\n", f.Why)
			}
			if f.Fix != "" {
				out.printf("        fix: %s\n", f.Fix)
			}
		}
	}
	if rep.Problems > 0 {
		out.printf("\n%d problem(s) found.\n", rep.Problems)
	} else {
		out.printf("\nNo problems found.\n")
	}
	out.emit(rep)
	if rep.Problems > 0 {
		return exitFinding
	}
	return exitOK
}
