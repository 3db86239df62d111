package harness

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/client-go/tools/clientcmd"
)

func TestWritePKIChains(t *testing.T) {
	p, err := writePKI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(p.caCert())
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		t.Fatal("CA does not parse")
	}
	load := func(name string) *x509.Certificate {
		t.Helper()
		pair, err := tls.LoadX509KeyPair(p.cert(name), p.key(name))
		if err != nil {
			t.Fatalf("%s key pair: %v", name, err)
		}
		c, err := x509.ParseCertificate(pair.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	tests := []struct {
		name     string
		usage    x509.ExtKeyUsage
		dnsName  string
		wantCN   string
		wantOrgs []string
	}{
		{name: "apiserver", usage: x509.ExtKeyUsageServerAuth, dnsName: "127.0.0.1", wantCN: "kube-apiserver"},
		{name: "apiserver", usage: x509.ExtKeyUsageServerAuth, dnsName: NodeIP, wantCN: "kube-apiserver"},
		{name: "apiserver", usage: x509.ExtKeyUsageServerAuth, dnsName: "kubernetes.default.svc", wantCN: "kube-apiserver"},
		{name: UserAdmin, usage: x509.ExtKeyUsageClientAuth, wantCN: "kp-e2e-admin", wantOrgs: []string{"system:masters"}},
		{name: UserKubeProxy, usage: x509.ExtKeyUsageClientAuth, wantCN: "system:kube-proxy"},
	}
	for _, tt := range tests {
		t.Run(tt.name+"/"+tt.dnsName, func(t *testing.T) {
			c := load(tt.name)
			if _, err := c.Verify(x509.VerifyOptions{Roots: roots, DNSName: tt.dnsName, KeyUsages: []x509.ExtKeyUsage{tt.usage}}); err != nil {
				t.Errorf("verify: %v", err)
			}
			if c.Subject.CommonName != tt.wantCN {
				t.Errorf("CN = %q, want %q", c.Subject.CommonName, tt.wantCN)
			}
			if diff := cmp.Diff(tt.wantOrgs, c.Subject.Organization); diff != "" {
				t.Errorf("O (-want +got):\n%s", diff)
			}
		})
	}
	if _, err := os.Stat(p.serviceAccountPub()); err != nil {
		t.Error(err)
	}
}

func TestWriteKubeconfig(t *testing.T) {
	p, err := writePKI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		user, server string
		wantErr      string
	}{
		{user: UserKubeProxy, server: "https://127.0.0.1:6443"},
		{user: UserAdmin, server: "https://10.250.0.1:443"},
		{user: "root", server: "https://127.0.0.1:6443", wantErr: "unknown user"},
		{user: UserAdmin, server: "http://127.0.0.1:8080", wantErr: "not an https"},
	}
	for _, tt := range tests {
		t.Run(tt.user+"@"+tt.server, func(t *testing.T) {
			path, err := writeKubeconfig(p, tt.user, tt.server)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := clientcmd.BuildConfigFromFlags("", path)
			if err != nil {
				t.Fatalf("loading: %v", err)
			}
			if cfg.Host != tt.server || cfg.CertFile != p.cert(tt.user) || cfg.KeyFile != p.key(tt.user) || cfg.CAFile != p.caCert() {
				t.Errorf("loaded %s, %s, %s, %s", cfg.Host, cfg.CertFile, cfg.KeyFile, cfg.CAFile)
			}
		})
	}
}

func TestBinDirNamesTheBuild(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(EnvBinDir, dir)
	got, err := BinDir()
	if got != dir {
		t.Errorf("BinDir = %q, want %q", got, dir)
	}
	if err == nil || !strings.Contains(err.Error(), BuildScript) || !strings.Contains(err.Error(), "kube-apiserver") {
		t.Errorf("err = %v, want it to name %s and the missing binary", err, BuildScript)
	}
	for _, b := range ClusterBinaries {
		if err := os.WriteFile(filepath.Join(dir, b), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := BinDir(); err != nil {
		t.Errorf("with all binaries: %v", err)
	}
}
