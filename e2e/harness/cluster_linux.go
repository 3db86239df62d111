package harness

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"kube-proxy/e2e/probe"
)

// Cluster is a real etcd and kube-apiserver running on loopback, started by StartCluster. There is no
// controller-manager or scheduler: tests write EndpointSlices and Nodes themselves.
type Cluster struct {
	// Dir is the state directory: certificates, kubeconfigs, etcd data and the logs
	// (etcd.log, apiserver.log).
	Dir string
	// Server is the apiserver's URL, https://127.0.0.1:PORT.
	Server string
	// CAFile is the CA certificate that signed the apiserver's serving certificate and the client
	// certificates.
	CAFile string
	// AdminKubeconfig is a kubeconfig for a member of system:masters.
	AdminKubeconfig string
	// ProxyKubeconfig is a kubeconfig for user system:kube-proxy (client certificate with
	// CN=system:kube-proxy), bound by upstream's bootstrap RBAC to ClusterRole system:node-proxier only.
	ProxyKubeconfig string
	// Admin is a clientset authenticated as admin.
	Admin kubernetes.Interface

	opts     ClusterOptions
	pki      pkiFiles
	bin      string
	etcdURL  string
	apiPort  int
	apiArgs  []string
	mu       sync.Mutex
	etcd     *Process
	api      *Process
	stopped  bool
	apiStart int // number of apiserver starts, to name log markers
}

// ClusterOptions tunes StartClusterWith. The zero value is what StartCluster uses.
type ClusterOptions struct {
	// ServiceCIDRs is --service-cluster-ip-range; default ServiceCIDR. Use
	// ServiceCIDR+","+ServiceCIDRv6 for a dual-stack cluster.
	ServiceCIDRs string
	// ExtraAPIServerArgs are appended to the apiserver's command line (e.g. "--feature-gates=...").
	ExtraAPIServerArgs []string
	// StartTimeout bounds the start when the context has no deadline; default 90 s.
	StartTimeout time.Duration
}

// StartCluster starts etcd and kube-apiserver on loopback with free ports and freshly generated
// certificates (crypto/x509; no openssl), --endpoint-reconciler-type=none and service CIDR
// 10.96.0.0/16, waits for /readyz, and returns the running cluster. dir must be empty or absent; it
// becomes the state directory. On failure everything started is stopped and the error carries the
// tail of the failing component's log.
func StartCluster(ctx context.Context, dir string) (*Cluster, error) {
	return StartClusterWith(ctx, dir, ClusterOptions{})
}

// StartClusterWith is StartCluster with options.
func StartClusterWith(ctx context.Context, dir string, opts ClusterOptions) (*Cluster, error) {
	if opts.ServiceCIDRs == "" {
		opts.ServiceCIDRs = ServiceCIDR
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 90 * time.Second
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, opts.StartTimeout)
		defer cancel()
	}
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating cluster dir: %w", err)
	}
	dir, err = filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("resolving cluster dir: %w", err)
	}
	p, err := writePKI(dir)
	if err != nil {
		return nil, fmt.Errorf("generating certificates: %w", err)
	}
	c := &Cluster{Dir: dir, CAFile: p.caCert(), opts: opts, pki: p, bin: bin}

	// A free port found by binding :0 may be taken by someone else before etcd or the apiserver
	// binds it; retry the start with new ports when that happens.
	for attempt := 1; ; attempt++ {
		err = c.start(ctx)
		if err == nil {
			break
		}
		_ = c.Stop()
		if attempt == 3 || !errors.Is(err, errAddrInUse) || ctx.Err() != nil {
			return nil, err
		}
		c.stopped = false
		_ = os.RemoveAll(filepath.Join(dir, "etcd"))
		_ = os.Remove(c.APIServerLogPath())
		_ = os.Remove(c.EtcdLogPath())
	}
	return c, nil
}

var errAddrInUse = errors.New("address already in use")

func (c *Cluster) start(ctx context.Context) error {
	ports, err := freePorts(3)
	if err != nil {
		return err
	}
	clientPort, peerPort := ports[0], ports[1]
	c.apiPort = ports[2]
	c.etcdURL = fmt.Sprintf("http://127.0.0.1:%d", clientPort)
	c.Server = fmt.Sprintf("https://127.0.0.1:%d", c.apiPort)
	if err := c.startEtcd(ctx, peerPort); err != nil {
		return err
	}
	if c.AdminKubeconfig, err = c.Kubeconfig(UserAdmin, c.Server); err != nil {
		return err
	}
	if c.ProxyKubeconfig, err = c.Kubeconfig(UserKubeProxy, c.Server); err != nil {
		return err
	}
	cfg, err := c.RESTConfig(UserAdmin)
	if err != nil {
		return err
	}
	if c.Admin, err = kubernetes.NewForConfig(cfg); err != nil {
		return fmt.Errorf("admin clientset: %w", err)
	}
	c.apiArgs = []string{
		"--etcd-servers=" + c.etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(c.apiPort),
		"--tls-cert-file=" + c.pki.cert("apiserver"),
		"--tls-private-key-file=" + c.pki.key("apiserver"),
		"--client-ca-file=" + c.pki.caCert(),
		"--service-account-key-file=" + c.pki.serviceAccountPub(),
		"--service-account-signing-key-file=" + c.pki.serviceAccountKey(),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-cluster-ip-range=" + c.opts.ServiceCIDRs,
		"--authorization-mode=Node,RBAC",
		"--endpoint-reconciler-type=none",
		"--cert-dir=" + filepath.Join(c.Dir, "apiserver-certs"),
		"--profiling=false",
		// Drain, then give open connections (watches) 2 s instead of --request-timeout's 60 s, so a
		// graceful stop takes seconds.
		"--shutdown-send-retry-after=true",
	}
	c.apiArgs = append(c.apiArgs, c.opts.ExtraAPIServerArgs...)
	return c.StartAPIServer(ctx)
}

func (c *Cluster) startEtcd(ctx context.Context, peerPort int) error {
	peer := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	cmd := exec.Command(filepath.Join(c.bin, "etcd"),
		"--name=kpt",
		"--data-dir="+filepath.Join(c.Dir, "etcd"),
		"--listen-client-urls="+c.etcdURL,
		"--advertise-client-urls="+c.etcdURL,
		"--listen-peer-urls="+peer,
		"--initial-advertise-peer-urls="+peer,
		"--initial-cluster=kpt="+peer,
		"--quota-backend-bytes=1073741824",
		"--unsafe-no-fsync",
		"--log-level=warn",
	)
	logPath := filepath.Join(c.Dir, "etcd.log")
	p, err := StartProcess("etcd", cmd, logPath)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.etcd = p
	c.mu.Unlock()
	hc := &http.Client{Timeout: 2 * time.Second}
	err = poll(ctx, p, 50*time.Millisecond, func() bool {
		resp, err := hc.Get(c.etcdURL + "/health")
		if err != nil {
			return false
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK && strings.Contains(string(body), `"health":"true"`)
	})
	if err != nil {
		return startError("etcd", logPath, err)
	}
	return nil
}

// StartAPIServer starts the apiserver again after StopAPIServer, on the same port with the same
// certificates and etcd, and waits for /readyz: clients that retry reconnect to it. It does nothing if
// the apiserver is running.
func (c *Cluster) StartAPIServer(ctx context.Context) error {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return errors.New("cluster stopped")
	}
	if c.api != nil && !c.api.Exited() {
		c.mu.Unlock()
		return nil
	}
	c.apiStart++
	logPath := filepath.Join(c.Dir, "apiserver.log")
	if f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err == nil {
		fmt.Fprintf(f, "==== kube-apiserver start #%d at %s ====\n", c.apiStart, time.Now().Format(time.RFC3339Nano))
		_ = f.Close()
	}
	p, err := StartProcess("kube-apiserver", exec.Command(filepath.Join(c.bin, "kube-apiserver"), c.apiArgs...), logPath)
	if err != nil {
		c.mu.Unlock()
		return err
	}
	c.api = p
	c.mu.Unlock()

	hc, err := c.httpClient(UserAdmin)
	if err != nil {
		return err
	}
	err = poll(ctx, p, 100*time.Millisecond, func() bool {
		resp, err := hc.Get(c.Server + "/readyz")
		if err != nil {
			return false
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	if err != nil {
		return startError("kube-apiserver", logPath, err)
	}
	return nil
}

// StopAPIServer stops the apiserver gracefully (SIGTERM; SIGKILL after 15 s, reported as an error),
// leaving etcd running, for API outage tests. Open watches are closed within about 2 s of the
// in-flight requests draining. It is idempotent.
func (c *Cluster) StopAPIServer() error {
	c.mu.Lock()
	p := c.api
	c.mu.Unlock()
	if p == nil {
		return nil
	}
	return p.Stop(syscall.SIGTERM, 15*time.Second)
}

// KillAPIServer kills the apiserver with SIGKILL (a crash: connections end without any goodbye),
// leaving etcd running. It is idempotent.
func (c *Cluster) KillAPIServer() error {
	c.mu.Lock()
	p := c.api
	c.mu.Unlock()
	if p == nil {
		return nil
	}
	if err := p.Stop(syscall.SIGKILL, 10*time.Second); err != nil {
		return fmt.Errorf("killing apiserver: %w", err)
	}
	return nil
}

// Stop stops the apiserver, then etcd, by PID. The state directory is left in place. It is idempotent.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	c.stopped = true
	api, etcd := c.api, c.etcd
	c.mu.Unlock()
	var errs []error
	if api != nil {
		errs = append(errs, api.Stop(syscall.SIGTERM, 15*time.Second))
	}
	if etcd != nil {
		errs = append(errs, etcd.Stop(syscall.SIGTERM, 10*time.Second))
	}
	return errors.Join(errs...)
}

// APIServerLogPath is the apiserver's log file (all starts, separated by marker lines).
func (c *Cluster) APIServerLogPath() string { return filepath.Join(c.Dir, "apiserver.log") }

// EtcdLogPath is etcd's log file.
func (c *Cluster) EtcdLogPath() string { return filepath.Join(c.Dir, "etcd.log") }

// LogTail returns the last n lines of the apiserver's and etcd's logs, for failure messages.
func (c *Cluster) LogTail(n int) string {
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			return fmt.Sprintf("(%v)", err)
		}
		return probe.Tail(string(b), n)
	}
	return "--- kube-apiserver log tail ---\n" + read(c.APIServerLogPath()) +
		"\n--- etcd log tail ---\n" + read(c.EtcdLogPath())
}

// APIServerPID returns the running apiserver's PID, 0 if it is not running.
func (c *Cluster) APIServerPID() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.api == nil || c.api.Exited() {
		return 0
	}
	return c.api.PID()
}

// Kubeconfig writes a kubeconfig for user (UserAdmin "admin" or UserKubeProxy "kube-proxy") pointing
// at server (e.g. "https://127.0.0.1:6443" for a daemon inside a namespace, behind Bridge) into Dir and
// returns its path. Certificates are referenced by absolute path, readable from any namespace.
func (c *Cluster) Kubeconfig(user, server string) (string, error) {
	return writeKubeconfig(c.pki, user, server)
}

// RESTConfig returns a client configuration for user talking to Server from this process's network
// namespace. Rate limits are raised so tests are not throttled.
func (c *Cluster) RESTConfig(user string) (*rest.Config, error) {
	if _, ok := clientSubjects[user]; !ok {
		return nil, fmt.Errorf("unknown user %q", user)
	}
	return &rest.Config{
		Host: c.Server,
		TLSClientConfig: rest.TLSClientConfig{
			CAFile:   c.pki.caCert(),
			CertFile: c.pki.cert(user),
			KeyFile:  c.pki.key(user),
		},
		QPS:     200,
		Burst:   400,
		Timeout: 30 * time.Second,
	}, nil
}

// RESTConfigInNS loads kubeconfig and makes its connections dial from inside ns (nil: this process's
// namespace), e.g. to use a kubeconfig returned by Bridge, whose server exists only inside ns.
func RESTConfigInNS(kubeconfig string, ns *NetNS) (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.QPS, cfg.Burst, cfg.Timeout = 200, 400, 30*time.Second
	if ns != nil {
		cfg.Dial = ns.DialContext
	}
	return cfg, nil
}

// ClientsetInNS is RESTConfigInNS followed by kubernetes.NewForConfig.
func ClientsetInNS(kubeconfig string, ns *NetNS) (kubernetes.Interface, error) {
	cfg, err := RESTConfigInNS(kubeconfig, ns)
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("clientset for %s: %w", kubeconfig, err)
	}
	return cs, nil
}

// httpClient is a plain HTTPS client authenticated as user, for health probes.
func (c *Cluster) httpClient(user string) (*http.Client, error) {
	caPEM, err := os.ReadFile(c.pki.caCert())
	if err != nil {
		return nil, fmt.Errorf("reading CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("parsing CA certificate")
	}
	cert, err := tls.LoadX509KeyPair(c.pki.cert(user), c.pki.key(user))
	if err != nil {
		return nil, fmt.Errorf("loading %s client certificate: %w", user, err)
	}
	return &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{
			TLSClientConfig:   &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
			DisableKeepAlives: true,
		},
	}, nil
}

// poll calls ok every interval until it returns true, p exits, or ctx ends.
func poll(ctx context.Context, p *Process, interval time.Duration, ok func() bool) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if ok() {
			return nil
		}
		select {
		case <-p.Done():
			return fmt.Errorf("%w: %v", errProcessExited, p.ExitErr())
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// startError describes a component that did not become healthy, with its log tail.
func startError(name, logPath string, err error) error {
	if logContains(logPath, "address already in use") {
		err = errors.Join(err, errAddrInUse)
	}
	b, _ := os.ReadFile(logPath)
	return fmt.Errorf("%s did not become ready: %w\n--- %s (tail) ---\n%s", name, err, logPath, probe.Tail(string(b), 30))
}

// freePorts returns n distinct loopback TCP ports that were free a moment ago.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// ClientCert returns the client certificate and key files of user (UserAdmin or UserKubeProxy), e.g.
// for curl --cert/--key.
func (c *Cluster) ClientCert(user string) (certFile, keyFile string, err error) {
	if _, ok := clientSubjects[user]; !ok {
		return "", "", fmt.Errorf("unknown user %q", user)
	}
	return c.pki.cert(user), c.pki.key(user), nil
}
