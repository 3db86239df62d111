package inspect

import (
	"context"
	"fmt"
	"io"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/proxy"
	"kube-proxy/rules/ipvs"
)

// DiffReport is diff's result, as --json prints it.
type DiffReport struct {
	Mode  string   `json:"mode"`
	Drift []Drift  `json:"drift"`
	Notes []string `json:"notes,omitempty"`
	Fix   string   `json:"fix,omitempty"`
}

func runDiff(ctx context.Context, env *Env, out *printer, stderr io.Writer) int {
	st, err := apiState(ctx, env)
	if err != nil {
		fmt.Fprintln(stderr, "kube-proxy diff:", err)
		return exitUsage
	}
	live, err := ReadLive(ctx)
	if err != nil {
		fmt.Fprintln(stderr, "kube-proxy diff:", err)
		return exitFinding
	}
	want, err := RenderDesired(env.Config, st.Snapshots, live.addrsBut(ipvs.DummyLink), live.NFAcct)
	if err != nil {
		fmt.Fprintln(stderr, "kube-proxy diff:", err)
		return exitUsage
	}
	rep := &DiffReport{Mode: string(want.Mode), Notes: live.Problems}
	if diff := inspectors[want.Mode].diff; diff != nil {
		if err := diff(ctx, env, want, live, rep); err != nil {
			fmt.Fprintln(stderr, "kube-proxy diff:", err)
			return exitFinding
		}
	}
	if len(rep.Drift) > 0 {
		rep.Fix = driftFix
	}
	if !out.json {
		for _, n := range rep.Notes {
			out.printf("note: %s\n", n)
		}
		if len(rep.Drift) == 0 {
			out.printf("No drift: the kernel holds what kube-proxy (mode %s) would write for the API's %d Services.\n", rep.Mode, len(st.Services))
		}
		last := ""
		for _, d := range rep.Drift {
			if d.Dataplane != last {
				out.printf("%s:\n", d.Dataplane)
				last = d.Dataplane
			}
			out.printf("  %s\n", d)
		}
		if len(rep.Drift) > 0 {
			out.printf("fix: %s\n", driftFix)
		}
	}
	out.emit(rep)
	if len(rep.Drift) > 0 {
		return exitFinding
	}
	return exitOK
}

// driftFix is what repairs drift: the daemon's first sync writes every rule of its mode and removes the
// other modes' rules; rules in a backend it does not use need --cleanup.
const driftFix = "restart kube-proxy (`systemctl restart kube-proxy`): its first sync rewrites all of its rules and " +
	"removes other modes' rules; rules in another iptables backend need `kube-proxy --cleanup` before the restart. " +
	"A foreign rule is another program's: find which one adds it."

func (e *Env) primaryFamily() v1.IPFamily { return proxy.Families(e.Config)[0] }
