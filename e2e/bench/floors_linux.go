package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"kube-proxy/e2e/harness"
)

// payloadFrom turns iptables-save output into a restore payload: comments and counters dropped, the
// builtin chains declared first and the others sorted (iptables-nft 1.8.9 is several times slower with
// unsorted declarations under --noflush).
func payloadFrom(saved string) []byte {
	var out strings.Builder
	var decl, rules []string
	flush := func() {
		builtin := func(s string) bool { return !strings.Contains(s, " - ") }
		slices.SortStableFunc(decl, func(a, b string) int {
			if ba, bb := builtin(a), builtin(b); ba != bb {
				if ba {
					return -1
				}
				return 1
			}
			return strings.Compare(a, b)
		})
		for _, l := range decl {
			out.WriteString(l + "\n")
		}
		for _, l := range rules {
			out.WriteString(l + "\n")
		}
		decl, rules = decl[:0], rules[:0]
	}
	for _, l := range strings.Split(saved, "\n") {
		switch {
		case l == "" || strings.HasPrefix(l, "#"):
		case strings.HasPrefix(l, "-A ") && strings.Contains(l, " -m nfacct "):
			// upstream's packet counters for its metrics: the nfacct objects exist only where it ran.
			rules = append(rules, withoutMatch(l, " -m nfacct --nfacct-name "))
		case strings.HasPrefix(l, "*"):
			out.WriteString(l + "\n")
		case strings.HasPrefix(l, ":"):
			if i := strings.LastIndex(l, " ["); i > 0 {
				l = l[:i] + " [0:0]"
			}
			decl = append(decl, l)
		case l == "COMMIT":
			flush()
			out.WriteString("COMMIT\n")
		default:
			rules = append(rules, l)
		}
	}
	return []byte(out.String())
}

// withoutMatch removes a match and its one argument (e.g. " -m nfacct --nfacct-name NAME") from a rule.
func withoutMatch(rule, match string) string {
	i := strings.Index(rule, match)
	if i < 0 {
		return rule
	}
	rest := strings.TrimLeft(rule[i+len(match):], " ")
	if j := strings.IndexByte(rest, ' '); j >= 0 {
		return rule[:i] + rest[j:]
	}
	return rule[:i]
}

// changeLines renders the nat lines of one endpoint change of Service s in the shapes an implementation
// wrote them (byChain is its saved nat table): the Service's KUBE-SVC chain rewritten with the endpoint
// extra ("ip:port") added or not, and extra's KUBE-SEP chain created (modelled on the chain of the
// Service's first endpoint) or deleted. services, if not nil, are KUBE-SERVICES rules to rewrite as well.
func changeLines(byChain map[string][]string, s *service, extra string, added bool, services []string) ([]byte, error) {
	var head, jumps []string
	for _, r := range byChain[s.Chain] {
		if strings.HasPrefix(ruleTarget(r), "KUBE-SEP-") {
			jumps = append(jumps, withoutMatch(r, " -m statistic --mode random --probability "))
		} else {
			head = append(head, r)
		}
	}
	tmplEP := s.Endpoints[0]
	tmplSEP := sepChain(benchNS, s.Name, portName, tmplEP)
	tmplRules := byChain[tmplSEP]
	if len(jumps) != len(s.Endpoints) || len(tmplRules) == 0 {
		return nil, fmt.Errorf("%s of %s: %d endpoint jumps and %d rules in %s, want %d and some", s.Chain, s.Name,
			len(jumps), len(tmplRules), tmplSEP, len(s.Endpoints))
	}
	sep := sepChain(benchNS, s.Name, portName, extra)
	tmplIP, _, _ := strings.Cut(tmplEP, ":")
	extraIP, _, _ := strings.Cut(extra, ":")
	swap := strings.NewReplacer("-A "+tmplSEP+" ", "-A "+sep+" ", "-j "+tmplSEP, "-j "+sep,
		tmplIP+"/32", extraIP+"/32", tmplEP, extra)
	if added {
		for _, j := range jumps {
			if ruleTarget(j) == tmplSEP {
				jumps = append(jumps, swap.Replace(j))
				break
			}
		}
	}
	var b strings.Builder
	b.WriteString("*nat\n")
	if services != nil {
		b.WriteString(":KUBE-SERVICES - [0:0]\n")
	}
	fmt.Fprintf(&b, ":%s - [0:0]\n:%s - [0:0]\n", s.Chain, sep)
	for _, r := range services {
		b.WriteString(r + "\n")
	}
	for _, r := range head {
		b.WriteString(r + "\n")
	}
	for i, r := range jumps {
		if left := len(jumps) - i; left > 1 {
			k := strings.LastIndex(r, " -j ")
			r = r[:k] + fmt.Sprintf(" -m statistic --mode random --probability %0.10f", 1/float64(left)) + r[k:]
		}
		b.WriteString(r + "\n")
	}
	if added {
		for _, r := range tmplRules {
			b.WriteString(swap.Replace(r) + "\n")
		}
	} else {
		fmt.Fprintf(&b, "-X %s\n", sep)
	}
	b.WriteString("COMMIT\n")
	return []byte(b.String()), nil
}

// changeFloor alternately adds and removes one extra endpoint of s, reps times each, in ns (which holds the
// full rule set byChain describes) and returns every restore's times.
func changeFloor(ns *harness.NetNS, mon *Monitor, byChain map[string][]string, s *service, reps int, services []string) ([]FloorSample, error) {
	extra := hostPort(extraEndpoint(0), podPort)
	var out []FloorSample
	for k := 0; k < 2*reps; k++ {
		lines, err := changeLines(byChain, s, extra, k%2 == 0, services)
		if err != nil {
			return nil, err
		}
		res, err := restore(ns, lines, true, mon)
		if err != nil {
			return nil, err
		}
		out = append(out, res.sample())
	}
	return out, nil
}

// measureFloors restores each implementation's saved payload into a fresh namespace and times one
// Service's endpoint change there (s is that Service), reps times each way.
func measureFloors(saved map[string]string, s *service, reps int, quiet time.Duration, logf func(string, ...any)) (Floors, error) {
	f := Floors{Whole: map[string]FloorSample{}, Change: map[string][]FloorSample{}}
	for _, impl := range []string{implOurs, implUpstream} {
		text, ok := saved[impl]
		if !ok {
			continue
		}
		if err := func() error {
			quiesce(quiet)
			ns, err := harness.NewNetNS("bench-floor")
			if err != nil {
				return err
			}
			defer func() { _ = ns.Delete() }()
			mon, err := NewMonitor(ns)
			if err != nil {
				return err
			}
			defer mon.Close()
			payload := payloadFrom(text)
			res, err := restore(ns, payload, true, mon)
			if err != nil {
				return fmt.Errorf("restoring the %s payload: %w", impl, err)
			}
			f.Whole[impl] = res.sample()
			logf("floor: %s payload (%d lines) restored with --noflush: committed after %v, exited after %v", impl,
				strings.Count(string(payload), "\n"), res.Commit.Round(time.Millisecond), res.Wall.Round(time.Millisecond))
			nat := harness.ParseSave(text)["nat"]
			if nat == nil {
				return fmt.Errorf("no nat table in the %s rules", impl)
			}
			byChain := rulesByChain(nat)
			if f.Change[impl], err = changeFloor(ns, mon, byChain, s, reps, nil); err != nil {
				return err
			}
			logf("floor: one Service's endpoint change over the %s rules: %s", impl, floorSummary(f.Change[impl]))
			switch impl {
			case implOurs:
				mon.Close()
				if f.ChangeUnmonitored, err = changeFloor(ns, nil, byChain, s, reps, nil); err != nil {
					return err
				}
				logf("floor: the same with no monitor listening: exited after p50 %v", floorP50(f.ChangeUnmonitored, false).Round(100*time.Microsecond))
			case implUpstream:
				services := byChain["KUBE-SERVICES"]
				if f.ChangeAndServices, err = changeFloor(ns, mon, byChain, s, reps, services); err != nil {
					return err
				}
				logf("floor: the same plus KUBE-SERVICES (%d rules) rewritten: %s", len(services), floorSummary(f.ChangeAndServices))
			}
			return nil
		}(); err != nil {
			return f, err
		}
	}
	return f, nil
}

// floorSummary is "committed p50 X, exited p50 Y".
func floorSummary(s []FloorSample) string {
	return fmt.Sprintf("committed after p50 %v, exited after p50 %v", floorP50(s, true).Round(100*time.Microsecond),
		floorP50(s, false).Round(100*time.Microsecond))
}

// measureNFTFloors loads the table ip kube-proxy one implementation listed after its cold sync (ours',
// else upstream's) into a fresh namespace with one `nft -f`, then times reps additions and as many
// removals of one endpoint of s there, each one `nft -f` of the transaction upstream's writer makes for
// that change. It returns nil when no listing was saved (no cold start finished). A load still running
// after loadCap is given up (LoadCapped).
func measureNFTFloors(listings map[string]string, s *service, reps int, quiet, loadCap time.Duration) (*NFTFloors, error) {
	f := &NFTFloors{}
	for _, impl := range []string{implUpstream, implOurs} {
		if _, ok := listings[impl]; ok {
			f.Source = impl
		}
	}
	if f.Source == "" {
		return nil, nil
	}
	quiesce(quiet)
	ns, err := harness.NewNetNS("bench-nftfloor")
	if err != nil {
		return nil, err
	}
	defer func() { _ = ns.Delete() }()
	mon, err := NewMonitor(ns)
	if err != nil {
		return nil, err
	}
	defer mon.Close()
	listing := listings[f.Source]
	whole, err := nftRun(ns, listing, mon, loadCap)
	if errors.Is(err, errNotInTime) {
		f.LoadCapped = loadCap
		logf("floor: the table %s listed (%d lines) not loaded by nft -f within %v: no floor of mode nftables", f.Source,
			strings.Count(listing, "\n"), loadCap)
		return f, nil
	}
	if err != nil {
		return nil, fmt.Errorf("loading the table %s listed: %w", f.Source, err)
	}
	f.Whole = whole.sample()
	logf("floor: the table %s listed (%d lines) loaded by nft -f: committed after %v, exited after %v", f.Source,
		strings.Count(listing, "\n"), f.Whole.Commit.Round(time.Millisecond), f.Whole.Wall.Round(time.Millisecond))
	extra := hostPort(extraEndpoint(0), podPort)
	for k := 0; k < 2*reps; k++ {
		eps := slices.Clone(s.Endpoints)
		if k%2 == 0 {
			eps = append(eps, extra)
			slices.Sort(eps)
		}
		res, err := nftRun(ns, nftChangeText(s.NFTChain, eps), mon, 0)
		if err != nil {
			return nil, err
		}
		f.Change = append(f.Change, res.sample())
	}
	logf("floor: one Service's endpoint change by nft -f over that table: %s", floorSummary(f.Change))
	return f, nil
}
