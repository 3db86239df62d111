package harness

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// EnvBinDir is the environment variable that overrides the directory holding the cluster binaries.
const EnvBinDir = "KP_CLUSTER_BINDIR"

// BuildScript is the script, relative to the repository root, that builds the cluster binaries.
const BuildScript = "e2e/tools/build-cluster.sh"

// ClusterBinaries are the executables BinDir must contain.
var ClusterBinaries = []string{"etcd", "kube-apiserver", "kube-proxy"}

// DefaultBinDir returns the directory the cluster binaries are cached in when KP_CLUSTER_BINDIR is
// unset: ${XDG_CACHE_HOME:-$HOME/.cache}/kube-proxy-e2e/bin, the default of e2e/tools/build-cluster.sh.
func DefaultBinDir() string {
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			home = "/root"
		}
		cache = filepath.Join(home, ".cache")
	}
	return filepath.Join(cache, "kube-proxy-e2e", "bin")
}

// BinDir returns the directory holding etcd, kube-apiserver and upstream kube-proxy: $KP_CLUSTER_BINDIR,
// or DefaultBinDir when that is unset. The error names the make target and script to run when a binary
// is missing; the directory is returned in either case.
func BinDir() (string, error) {
	dir := os.Getenv(EnvBinDir)
	if dir == "" {
		dir = DefaultBinDir()
	}
	var missing []error
	for _, name := range ClusterBinaries {
		p := filepath.Join(dir, name)
		st, err := os.Stat(p)
		switch {
		case err != nil:
			missing = append(missing, fmt.Errorf("%s: %w", p, err))
		case st.IsDir() || st.Mode().Perm()&0o111 == 0:
			missing = append(missing, fmt.Errorf("%s is not an executable file", p))
		}
	}
	if len(missing) > 0 {
		return dir, fmt.Errorf("cluster binaries missing (build them with `make cluster-bins` or `%s %s`): %w",
			BuildScript, dir, errors.Join(missing...))
	}
	return dir, nil
}
