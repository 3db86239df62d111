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
	ca, err := NewCA(dir, "kp-e2e-ca")
	if err != nil {
		return p, err
	}
	if _, _, err := ca.Issue("apiserver", ServingTemplate("kube-apiserver", servingIPs, servingNames)); err != nil {
		return p, err
	}
	for user, subject := range clientSubjects {
		if _, _, err := ca.Issue(user, ClientTemplate(subject)); err != nil {
			return p, err
		}
	}
	return p, WriteServiceAccountKeys(p.serviceAccountKey(), p.serviceAccountPub())
}

// CA is a certificate authority for a test cluster: its certificate is Dir/ca.crt, its key Dir/ca.key,
// and the certificates it issues go beside them. Everything is made with crypto/x509 (no openssl);
// keys are ECDSA P-256 (fast to make, accepted by every component); certificates are valid for a week.
type CA struct {
	// Dir holds the CA's files and those of the certificates it issues.
	Dir string

	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// NewCA creates a self-signed CA named commonName in dir (which must exist).
func NewCA(dir, commonName string) (*CA, error) {
	key, err := newKey()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := sign(tmpl, tmpl, key, key)
	if err != nil {
		return nil, fmt.Errorf("signing CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parsing CA certificate: %w", err)
	}
	ca := &CA{Dir: dir, cert: cert, key: key}
	if err := writePEM(ca.CertFile(), "CERTIFICATE", der, 0o644); err != nil {
		return nil, err
	}
	if err := writeKey(filepath.Join(dir, "ca.key"), key); err != nil {
		return nil, err
	}
	return ca, nil
}

// CertFile is the CA certificate's path.
func (ca *CA) CertFile() string { return filepath.Join(ca.Dir, "ca.crt") }

// Issue signs tmpl (from ClientTemplate or ServingTemplate) with a new key, valid as long as the CA,
// and writes Dir/<name>.crt and Dir/<name>.key, whose paths it returns.
func (ca *CA) Issue(name string, tmpl *x509.Certificate) (certFile, keyFile string, err error) {
	key, err := newKey()
	if err != nil {
		return "", "", err
	}
	tmpl.NotBefore, tmpl.NotAfter = ca.cert.NotBefore, ca.cert.NotAfter
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := sign(tmpl, ca.cert, key, ca.key)
	if err != nil {
		return "", "", fmt.Errorf("signing %s certificate: %w", name, err)
	}
	certFile, keyFile = filepath.Join(ca.Dir, name+".crt"), filepath.Join(ca.Dir, name+".key")
	if err := writePEM(certFile, "CERTIFICATE", der, 0o644); err != nil {
		return "", "", err
	}
	return certFile, keyFile, writeKey(keyFile, key)
}

// ClientTemplate is a client certificate for subject (CommonName is the user, Organization its groups).
func ClientTemplate(subject pkix.Name) *x509.Certificate {
	return &x509.Certificate{Subject: subject, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
}

// ServingTemplate is a serving certificate named commonName, valid for the addresses ips and the
// names dnsNames.
func ServingTemplate(commonName string, ips, dnsNames []string) *x509.Certificate {
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: commonName},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    dnsNames,
	}
	for _, s := range ips {
		tmpl.IPAddresses = append(tmpl.IPAddresses, net.ParseIP(s))
	}
	return tmpl
}

// WriteServiceAccountKeys writes a new service-account signing key to priv and its public key to pub.
func WriteServiceAccountKeys(priv, pub string) error {
	key, err := newKey()
	if err != nil {
		return err
	}
	if err := writeKey(priv, key); err != nil {
		return err
	}
	der, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return fmt.Errorf("encoding service-account public key: %w", err)
	}
	return writePEM(pub, "PUBLIC KEY", der, 0o644)
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
