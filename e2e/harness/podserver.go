package harness

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// EnvPodServer names a prebuilt podserver binary to use instead of building one.
const EnvPodServer = "KP_PODSERVER"

// PodServerPackage is the import path of the pod server.
const PodServerPackage = "kube-proxy/e2e/podserver"

var podServer struct {
	once sync.Once
	path string
	err  error
}

// BuildPodServer returns the path of a static podserver binary ($KP_PODSERVER if set), building
// e2e/podserver with `go build` (CGO_ENABLED=0, so it also runs in a VM's initramfs) on first use in
// this process into ${XDG_CACHE_HOME:-~/.cache}/kube-proxy-e2e/podserver. It must be called from within
// the kube-proxy module (any test directory of it).
func BuildPodServer() (string, error) {
	podServer.once.Do(func() {
		podServer.path, podServer.err = buildPodServer()
	})
	return podServer.path, podServer.err
}

func buildPodServer() (string, error) {
	if p := os.Getenv(EnvPodServer); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%s=%s: %w", EnvPodServer, p, err)
		}
		return p, nil
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	outDir := filepath.Join(filepath.Dir(DefaultBinDir()), "podserver")
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return "", fmt.Errorf("creating %s: %w", outDir, err)
	}
	// Build to a private name and rename, so concurrent test binaries never run a half-written file.
	tmp, err := os.CreateTemp(outDir, ".podserver-*")
	if err != nil {
		return "", fmt.Errorf("creating podserver output: %w", err)
	}
	_ = tmp.Close()
	defer os.Remove(tmp.Name())
	cmd := exec.Command("go", "build", "-buildvcs=false", "-o", tmp.Name(), "./e2e/podserver")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building %s: %w: %s", PodServerPackage, err, strings.TrimSpace(string(out)))
	}
	path := filepath.Join(outDir, "podserver")
	if err := os.Rename(tmp.Name(), path); err != nil {
		return "", fmt.Errorf("installing podserver: %w", err)
	}
	return path, nil
}

// moduleRoot finds the directory of the kube-proxy module's go.mod, from the working directory up.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("finding module root: %w", err)
	}
	for {
		if isKubeProxyModule(filepath.Join(dir, "go.mod")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("finding module root: no go.mod of module kube-proxy above the working directory")
		}
		dir = parent
	}
}

func isKubeProxyModule(gomod string) bool {
	f, err := os.Open(gomod)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) == 2 && fields[0] == "module" {
			return fields[1] == "kube-proxy"
		}
	}
	return false
}
