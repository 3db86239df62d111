package harness

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
)

// writeKubeconfig writes a kubeconfig for user (UserAdmin or UserKubeProxy) pointing at server, with
// the CA and client certificate referenced by absolute path, into the PKI directory, and returns its
// path. The file name depends on user and server only, so writing the same one twice is harmless.
func writeKubeconfig(p pkiFiles, user, server string) (string, error) {
	if _, ok := clientSubjects[user]; !ok {
		return "", fmt.Errorf("unknown user %q (want %q or %q)", user, UserAdmin, UserKubeProxy)
	}
	u, err := url.Parse(server)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return "", fmt.Errorf("server %q is not an https:// URL", server)
	}
	abs := func(f string) (string, error) { return filepath.Abs(f) }
	ca, err := abs(p.caCert())
	if err != nil {
		return "", fmt.Errorf("resolving CA path: %w", err)
	}
	cert, err := abs(p.cert(user))
	if err != nil {
		return "", fmt.Errorf("resolving certificate path: %w", err)
	}
	key, err := abs(p.key(user))
	if err != nil {
		return "", fmt.Errorf("resolving key path: %w", err)
	}
	sum := sha256.Sum256([]byte(server))
	path := filepath.Join(p.dir, fmt.Sprintf("%s-%s.kubeconfig", user, hex.EncodeToString(sum[:4])))
	if err := WriteKubeconfig(path, server, ca, cert, key); err != nil {
		return "", err
	}
	return filepath.Abs(path)
}

// WriteKubeconfig writes, atomically, a kubeconfig at path for server with the CA, client certificate
// and key files named by their paths (make them absolute: the file is read from other directories).
func WriteKubeconfig(path, server, caFile, certFile, keyFile string) error {
	q := strconv.Quote // a Go-quoted ASCII string is a valid YAML double-quoted scalar
	content := "apiVersion: v1\nkind: Config\n" +
		"clusters:\n- name: kp-e2e\n  cluster:\n    server: " + q(server) + "\n    certificate-authority: " + q(caFile) + "\n" +
		"users:\n- name: user\n  user:\n    client-certificate: " + q(certFile) + "\n    client-key: " + q(keyFile) + "\n" +
		"contexts:\n- name: kp-e2e\n  context:\n    cluster: kp-e2e\n    user: user\n" +
		"current-context: kp-e2e\n"
	if err := writeFileAtomic(path, []byte(content), 0o600); err != nil {
		return fmt.Errorf("writing kubeconfig: %w", err)
	}
	return nil
}

// writeFileAtomic writes data to a temporary file beside path and renames it into place, so concurrent
// writers and readers never see a partial file.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	_, werr := f.Write(data)
	cerr := f.Close()
	if err := errors.Join(werr, cerr, os.Chmod(f.Name(), mode)); err != nil {
		_ = os.Remove(f.Name())
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		_ = os.Remove(f.Name())
		return err
	}
	return nil
}
