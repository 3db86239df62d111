package inspect

import (
	"context"
	"fmt"
	"io"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/config"
	"kube-proxy/proxy"
	"kube-proxy/rules/iptables/iptrace"
	"kube-proxy/rules/ipvs"
	"kube-proxy/rules/nftables"
	"kube-proxy/rules/xtables"
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
	switch want.Mode {
	case config.ModeIPTables, config.ModeIPVS:
		backend, why, err := xtables.Detect(ctx)
		if err != nil {
			fmt.Fprintln(stderr, "kube-proxy diff:", err)
			return exitFinding
		}
		rep.Notes = append(rep.Notes, fmt.Sprintf("compared with the %s backend (%s)", backend, why))
		for _, f := range want.Families() {
			var x *XTables
			for _, c := range live.XTables {
				if c.Backend == backend && c.Family == f {
					x = c
				}
			}
			if x == nil {
				if f != env.primaryFamily() {
					rep.Notes = append(rep.Notes, fmt.Sprintf("%s: no %s tables to compare (single-stack node?)", f, backend))
					continue
				}
				x = &XTables{Backend: backend, Family: f, Tables: iptrace.New(f == v1.IPv6Protocol)}
			}
			rep.Drift = append(rep.Drift, DiffIPTables(want.XT[f], x)...)
			if d := want.IPVS[f]; d != nil {
				rep.Drift = append(rep.Drift, DiffIPVS(d, live, f)...)
			}
			for _, u := range x.Unreadable {
				rep.Notes = append(rep.Notes, "not compared (the tracer does not model it): "+u)
			}
		}
		for _, x := range live.XTables {
			if x.Backend != backend && !x.Empty() {
				rep.Drift = append(rep.Drift, Drift{Kind: "stale", Dataplane: fmt.Sprintf("iptables (%s backend) %s", x.Backend, x.Family),
					Object: fmt.Sprintf("%d chains in the other backend", x.Chains), Detail: "kube-proxy chains in a backend the daemon does not use"})
			}
		}
	case config.ModeNFTables:
		for _, f := range want.Families() {
			if err := nftables.FamilyUsable(f); err != nil && f != env.primaryFamily() {
				rep.Notes = append(rep.Notes, fmt.Sprintf("%s: not compared (%v)", f, err))
				continue
			}
			rep.Drift = append(rep.Drift, DiffNFTables(want.NFT, live.NFT, f)...)
		}
		for _, x := range live.XTables {
			if !x.Empty() {
				rep.Drift = append(rep.Drift, Drift{Kind: "stale", Dataplane: fmt.Sprintf("iptables (%s backend) %s", x.Backend, x.Family),
					Object: fmt.Sprintf("%d iptables chains", x.Chains), Detail: "mode iptables' or ipvs' chains beside mode nftables"})
			}
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
