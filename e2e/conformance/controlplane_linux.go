package main

import (
	"context"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"kube-proxy/e2e/harness"
)

// apiServer is the apiserver's URL, reachable from the lab namespace and every node.
var apiServer = "https://" + labIP + ":" + strconv.Itoa(apiPort)

// users are the lab's client certificates: the user (CommonName) and groups each component
// authenticates as, bound by upstream's bootstrap RBAC (or the Node authorizer for kubelets).
func (l *Lab) users() map[string]pkix.Name {
	u := map[string]pkix.Name{
		"admin":                    {CommonName: "kpc-admin", Organization: []string{"system:masters"}},
		"kube-proxy":               {CommonName: "system:kube-proxy"},
		"kube-controller-manager":  {CommonName: "system:kube-controller-manager"},
		"kube-scheduler":           {CommonName: "system:kube-scheduler"},
		"apiserver-kubelet-client": {CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}},
	}
	for _, n := range l.nodes {
		u["kubelet-"+n.name] = pkix.Name{CommonName: "system:node:" + n.name, Organization: []string{"system:nodes"}}
	}
	return u
}

func (l *Lab) pki() string { return filepath.Join(l.Dir, "pki") }

// kubeconfig is the path of user's kubeconfig for the lab's apiserver.
func (l *Lab) kubeconfig(user string) string { return filepath.Join(l.pki(), user+".kubeconfig") }

// writePKI makes the CA, the apiserver's serving certificate, a client certificate and kubeconfig for
// each user, and the service-account key pair.
func (l *Lab) writePKI() error {
	if err := os.MkdirAll(l.pki(), 0o700); err != nil {
		return err
	}
	ca, err := harness.NewCA(l.pki(), "kpc-ca")
	if err != nil {
		return err
	}
	l.ca = ca
	serving := harness.ServingTemplate("kube-apiserver", []string{labIP, "10.96.0.1", "127.0.0.1"},
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"})
	if _, _, err := ca.Issue("apiserver", serving); err != nil {
		return err
	}
	for user, subject := range l.users() {
		cert, key, err := ca.Issue(user, harness.ClientTemplate(subject))
		if err != nil {
			return err
		}
		if err := harness.WriteKubeconfig(l.kubeconfig(user), apiServer, ca.CertFile(), cert, key); err != nil {
			return err
		}
	}
	l.admin = l.kubeconfig("admin")
	return harness.WriteServiceAccountKeys(filepath.Join(l.pki(), "sa.key"), filepath.Join(l.pki(), "sa.pub"))
}

// startControlPlane starts etcd, the apiserver, the controller-manager, the scheduler and CoreDNS in the
// lab namespace and waits until the apiserver is ready.
func (l *Lab) startControlPlane(ctx context.Context) (kubernetes.Interface, error) {
	if err := makeCgroup(cgroupPrefix + "lab"); err != nil {
		return nil, err
	}
	cg := cgroupPrefix + "lab"
	pki := l.pki()
	etcdURL := "http://127.0.0.1:2379"
	if _, err := l.spawn("etcd", labNS, cg, nil, filepath.Join(l.bins.cluster, "etcd"),
		"--name=kpc", "--data-dir="+filepath.Join(l.Dir, "etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380",
		"--initial-cluster=kpc=http://127.0.0.1:2380", "--quota-backend-bytes=2147483648",
		"--unsafe-no-fsync", "--log-level=warn"); err != nil {
		return nil, err
	}
	api, err := l.spawn("kube-apiserver", labNS, cg, nil, filepath.Join(l.bins.cluster, "kube-apiserver"),
		"--etcd-servers="+etcdURL,
		"--bind-address="+labIP, "--advertise-address="+labIP, "--secure-port="+strconv.Itoa(apiPort),
		"--tls-cert-file="+filepath.Join(pki, "apiserver.crt"), "--tls-private-key-file="+filepath.Join(pki, "apiserver.key"),
		"--client-ca-file="+l.ca.CertFile(),
		"--service-account-key-file="+filepath.Join(pki, "sa.pub"),
		"--service-account-signing-key-file="+filepath.Join(pki, "sa.key"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range="+serviceCIDR,
		"--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
		"--allow-privileged=true",
		"--kubelet-client-certificate="+filepath.Join(pki, "apiserver-kubelet-client.crt"),
		"--kubelet-client-key="+filepath.Join(pki, "apiserver-kubelet-client.key"),
		"--kubelet-preferred-address-types=InternalIP,Hostname",
		"--cert-dir="+filepath.Join(l.Dir, "apiserver-certs"), "--profiling=false")
	if err != nil {
		return nil, err
	}
	cs, err := harness.ClientsetInNS(l.admin, labNetNS())
	if err != nil {
		return nil, err
	}
	if err := waitFor(ctx, "the apiserver's /readyz", 90*time.Second, func() error {
		if api.Exited() {
			return errStop(fmt.Errorf("kube-apiserver exited: %s", api.LogTail(15)))
		}
		body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			return fmt.Errorf("%w: %s", err, body)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	if _, err := l.spawn("kube-controller-manager", labNS, cg, nil, l.bins.k8s("kube-controller-manager"),
		"--kubeconfig="+l.kubeconfig("kube-controller-manager"),
		"--bind-address=127.0.0.1", "--leader-elect=false",
		"--service-account-private-key-file="+filepath.Join(pki, "sa.key"), "--root-ca-file="+l.ca.CertFile(),
		"--use-service-account-credentials=true",
		"--cluster-cidr="+clusterCIDR, "--service-cluster-ip-range="+serviceCIDR, "--allocate-node-cidrs=false",
		"--profiling=false"); err != nil {
		return nil, err
	}
	if _, err := l.spawn("kube-scheduler", labNS, cg, nil, l.bins.k8s("kube-scheduler"),
		"--kubeconfig="+l.kubeconfig("kube-scheduler"), "--bind-address=127.0.0.1", "--leader-elect=false",
		"--profiling=false"); err != nil {
		return nil, err
	}
	return cs, nil
}

// startDNS runs CoreDNS in the lab namespace on labIP:53, behind the kube-dns Service (10.96.0.10), with
// an EndpointSlice written here: a host process, as the DNS of many clusters built the hard way is.
func (l *Lab) startDNS(ctx context.Context, cs kubernetes.Interface) error {
	corefile := filepath.Join(l.Dir, "Corefile")
	conf := fmt.Sprintf(`.:53 {
    bind %s
    errors
    health 127.0.0.1:8080
    ready 127.0.0.1:8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig %s
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }
    cache 30
    loadbalance
}
`, labIP, l.admin)
	if err := os.WriteFile(corefile, []byte(conf), 0o644); err != nil {
		return err
	}
	dns, err := l.spawn("coredns", labNS, cgroupPrefix+"lab", nil, l.bins.k8s("coredns"), "-conf", corefile)
	if err != nil {
		return err
	}
	ns := labNetNS()
	if err := waitFor(ctx, "CoreDNS ready", 60*time.Second, func() error {
		if dns.Exited() {
			return errStop(fmt.Errorf("coredns exited: %s", dns.LogTail(15)))
		}
		resp, err := ns.HTTPClient().Get("http://127.0.0.1:8181/ready")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}); err != nil {
		return err
	}
	udp, tcp := corev1.ProtocolUDP, corev1.ProtocolTCP
	port := int32(53)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-dns", Namespace: "kube-system",
			Labels: map[string]string{"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS"}},
		Spec: corev1.ServiceSpec{ClusterIP: dnsServiceIP, Ports: []corev1.ServicePort{
			{Name: "dns", Protocol: udp, Port: 53}, {Name: "dns-tcp", Protocol: tcp, Port: 53}}},
	}
	if _, err := cs.CoreV1().Services("kube-system").Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating kube-dns Service: %w", err)
	}
	ready := true
	dnsName, tcpName := "dns", "dns-tcp"
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-dns-lab", Namespace: "kube-system", Labels: map[string]string{
			discoveryv1.LabelServiceName: "kube-dns", discoveryv1.LabelManagedBy: "kube-proxy-conformance-lab"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{labIP}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		Ports:       []discoveryv1.EndpointPort{{Name: &dnsName, Protocol: &udp, Port: &port}, {Name: &tcpName, Protocol: &tcp, Port: &port}},
	}
	if _, err := cs.DiscoveryV1().EndpointSlices("kube-system").Create(ctx, slice, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating kube-dns EndpointSlice: %w", err)
	}
	return nil
}

// stopError marks an error that waitFor must not retry.
type stopError struct{ error }

func errStop(err error) error { return stopError{err} }

// waitFor polls cond every 500 ms until it returns nil, it returns a stopError, ctx ends or timeout
// passes; the error then names what was awaited and cond's last error.
func waitFor(ctx context.Context, what string, timeout time.Duration, cond func() error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		last = cond()
		if last == nil {
			return nil
		}
		var stop stopError
		if errors.As(last, &stop) {
			return fmt.Errorf("waiting for %s: %w", what, stop.error)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %v (last: %w)", what, ctx.Err(), last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}
