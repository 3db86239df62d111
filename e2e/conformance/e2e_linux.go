package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"kube-proxy/e2e/conformance/results"
)

// runE2E runs upstream's e2e.test through the ginkgo CLI in the lab namespace (where the test runner
// reaches the apiserver and every node's address, as a runner next to a cluster does), with the
// selection sel, into dir: the JUnit report, the runner's log, and run.json.
func (l *Lab) runE2E(ctx context.Context, spec runSpec, sel selection, dir string) (*results.Run, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	args := []string{"--net=/run/netns/" + labNS, "--", l.bins.k8s("ginkgo"),
		"--procs=" + strconv.Itoa(sel.procs), "--timeout=" + sel.timeout.String(),
		"--focus=" + sel.focus, "--skip=" + sel.skip,
		"--output-dir=" + dir, "--junit-report=junit.xml", "--no-color", "-v",
		l.bins.k8s("e2e.test"), "--",
		"--kubeconfig=" + l.admin, "--provider=local", "--kubectl-path=" + l.bins.k8s("kubectl"),
		"--report-dir=" + dir, "--e2e-output-dir=" + dir,
		"--minStartupPods=0", "--dump-logs-on-failure=false", "--disable-log-dump",
		// Without it, the suite counts the nodes in ginkgo's first process only, and the tests that
		// need two nodes skip themselves in every other process ("Requires at least 2 nodes (not -1)").
		"--num-nodes=" + strconv.Itoa(len(l.nodes)),
	}
	logPath := filepath.Join(dir, "e2e.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.CommandContext(ctx, "nsenter", args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = dir
	cmd.WaitDelay = 30 * time.Second
	run := &results.Run{Impl: spec.Impl, Mode: spec.Mode, Way: spec.Way, Start: time.Now().UTC(),
		Command: "ginkgo " + strings.Join(args[3:], " "), KubeProxy: l.kubeProxyVersions[spec.Impl]}
	start := time.Now() // run.Start is UTC, without the monotonic reading
	err = cmd.Run()
	run.Seconds = time.Since(start).Seconds()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		run.ExitCode = exit.ExitCode() // failed tests: the JUnit report says which
	case err != nil:
		run.Error = err.Error()
	}
	if _, statErr := os.Stat(filepath.Join(dir, "junit.xml")); statErr != nil {
		run.Error = strings.TrimSpace(run.Error + fmt.Sprintf(" no JUnit report (%v); last lines of %s:\n%s", statErr, logPath, tailFile(logPath, 20)))
	}
	return run, results.WriteJSON(filepath.Join(dir, "run.json"), run)
}

func tailFile(path string, n int) string {
	b, _ := os.ReadFile(path)
	return tailLines(string(b), n)
}
