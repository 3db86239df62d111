package harness

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Users for which the cluster has client certificates, usable with Cluster.Kubeconfig.
const (
	// UserAdmin is a member of system:masters.
	UserAdmin = "admin"
	// UserKubeProxy authenticates as system:kube-proxy, which upstream's bootstrap RBAC binds to the
	// ClusterRole system:node-proxier.
	UserKubeProxy = "kube-proxy"
)

// clientSubjects are the certificate subjects of the users above.
var clientSubjects = map[string]pkix.Name{
	UserAdmin:     {CommonName: "kp-e2e-admin", Organization: []string{"system:masters"}},
	UserKubeProxy: {CommonName: "system:kube-proxy"},
}

// servingIPs are the addresses the apiserver's serving certificate is valid for: loopback, the first
// address of the service CIDR, and the topology's node addresses (so a bridge may listen there).
var servingIPs = []string{"127.0.0.1", "::1", "10.96.0.1", NodeIP, NodeIPv6}

var servingNames = []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
	"kubernetes.default.svc.cluster.local"}

// pkiFiles names the files writePKI creates in a directory.
type pkiFiles struct{ dir string }

func (p pkiFiles) path(name string) string   { return filepath.Join(p.dir, name) }
func (p pkiFiles) caCert() string            { return p.path("ca.crt") }
func (p pkiFiles) cert(user string) string   { return p.path(user + ".crt") }
func (p pkiFiles) key(user string) string    { return p.path(user + ".key") }
func (p pkiFiles) serviceAccountKey() string { return p.path("sa.key") }
func (p pkiFiles) serviceAccountPub() string { return p.path("sa.pub") }

// writePKI generates, with crypto/x509 only, a CA, the apiserver's serving certificate ("apiserver"),
// client certificates for every user in clientSubjects, and the service-account signing key pair.
// Keys are ECDSA P-256 (fast to make, accepted by every component); certificates are valid for a week.
func writePKI(dir string) (pkiFiles, error) {
	p := pkiFiles{dir: dir}
	now := time.Now()
	caKey, err := newKey()
	if err != nil {
		return p, err
	}
	caTmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "kp-e2e-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := sign(caTmpl, caTmpl, caKey, caKey)
	if err != nil {
		return p, fmt.Errorf("signing CA certificate: %w", err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return p, fmt.Errorf("parsing CA certificate: %w", err)
	}
	if err := writePEM(p.caCert(), "CERTIFICATE", caDER, 0o644); err != nil {
		return p, err
	}
	if err := writeKey(p.key("ca"), caKey); err != nil {
		return p, err
	}

	issue := func(name string, tmpl *x509.Certificate) error {
		key, err := newKey()
		if err != nil {
			return err
		}
		tmpl.NotBefore, tmpl.NotAfter = caTmpl.NotBefore, caTmpl.NotAfter
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		der, err := sign(tmpl, caCert, key, caKey)
		if err != nil {
			return fmt.Errorf("signing %s certificate: %w", name, err)
		}
		if err := writePEM(p.cert(name), "CERTIFICATE", der, 0o644); err != nil {
			return err
		}
		return writeKey(p.key(name), key)
	}

	serving := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    servingNames,
	}
	for _, s := range servingIPs {
		serving.IPAddresses = append(serving.IPAddresses, net.ParseIP(s))
	}
	if err := issue("apiserver", serving); err != nil {
		return p, err
	}
	for user, subject := range clientSubjects {
		tmpl := &x509.Certificate{Subject: subject, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
		if err := issue(user, tmpl); err != nil {
			return p, err
		}
	}

	saKey, err := newKey()
	if err != nil {
		return p, err
	}
	if err := writeKey(p.serviceAccountKey(), saKey); err != nil {
		return p, err
	}
	pub, err := x509.MarshalPKIXPublicKey(saKey.Public())
	if err != nil {
		return p, fmt.Errorf("encoding service-account public key: %w", err)
	}
	return p, writePEM(p.serviceAccountPub(), "PUBLIC KEY", pub, 0o644)
}

func newKey() (*ecdsa.PrivateKey, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating key: %w", err)
	}
	return k, nil
}

func sign(tmpl, parent *x509.Certificate, key *ecdsa.PrivateKey, parentKey crypto.Signer) ([]byte, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, fmt.Errorf("generating serial number: %w", err)
	}
	tmpl.SerialNumber = serial
	return x509.CreateCertificate(rand.Reader, tmpl, parent, key.Public(), parentKey)
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("encoding key %s: %w", path, err)
	}
	return writePEM(path, "EC PRIVATE KEY", der, 0o600)
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	data := pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
	if err := os.WriteFile(path, data, mode); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
