package ipvsvm

import "net/netip"

// Params tell the guest agent what to run; the host writes them to ParamsPath in the initramfs.
type Params struct {
	// Cases are the dataplane cases to run, by name; empty runs them all (see CaseNames).
	Cases []string `json:"cases,omitempty"`
	// Bench is the number of Services (3 real servers each) of the sync benchmark; 0 skips it.
	Bench int `json:"bench,omitempty"`
	// Daemon, when set, runs a kube-proxy daemon in IPVS mode against the host's apiserver.
	Daemon *DaemonParams `json:"daemon,omitempty"`
	// SideBySide, when set, runs kube-proxy implementations in IPVS mode one after the other against the
	// host's apiserver, which holds the benchmark's Services (see BenchClusterIP), and measures them.
	SideBySide *SideBySideParams `json:"sideBySide,omitempty"`
	// Faults, when set, runs the fault table's rows for mode ipvs (see FaultsParams).
	Faults *FaultsParams `json:"faults,omitempty"`
}

// FaultsParams describe the fault rows of a VM run: the daemon runs against the host's apiserver with
// traffic from the client namespace to Service web (pods 1-3, a cluster IP and a NodePort), and the agent
// breaks one thing at a time, measures, and sends each row as a ROW line (a JSON faults.Row). What it
// needs the host to do (stop or start the apiserver, create a Service) it asks over HTTP at Control.
type FaultsParams struct {
	// Faults are the rows to measure, by name (see FaultNames); empty measures them all.
	Faults []string `json:"faults,omitempty"`
	// Binary is the daemon's path in the guest; FaultsBinary the faults build's (-tags faultinject), empty
	// when there is none (the apply-failing row is then skipped).
	Binary       string `json:"binary"`
	FaultsBinary string `json:"faultsBinary,omitempty"`
	// Config is the daemon's configuration file in the guest (the agent edits it for the reload rows).
	Config string `json:"config"`
	// Control is the host's control URL as the guest reaches it (http://10.0.2.2:<port>): GET
	// <Control>/<action>?<args> returns once the host has done it, with the Service's cluster IP for the
	// create actions (FaultActions).
	Control string `json:"control"`
	// WebIP and WebNodePort are Service web's cluster IP and TCP node port (port 80, pods 1-3).
	WebIP       string `json:"webIP"`
	WebNodePort int    `json:"webNodePort"`
	// SyncPeriod is the configured ipvs.syncPeriod; Baseline, APIDown and FailFor how long the baseline,
	// the apiserver outage and the failing writes last; Big the endpoints of the kill row's Service.
	SyncPeriod string `json:"syncPeriod"`
	Baseline   string `json:"baseline"`
	APIDown    string `json:"apiDown"`
	FailFor    string `json:"failFor"`
	Big        int    `json:"big"`
}

// FaultNames are the fault rows the agent knows, in the order it measures them.
var FaultNames = []string{"baseline", "apiserver-down", "state-removed", "reload", "kill-during-sync", "apply-failing"}

// FaultActions are what the agent may ask the host at FaultsParams.Control.
const (
	ActionStopAPIServer  = "stop-apiserver"  // stop kube-apiserver (SIGTERM), etcd stays
	ActionStartAPIServer = "start-apiserver" // start it again and wait for /readyz
	ActionCreate         = "create"          // ?name=&pod=: a ClusterIP Service (TCP 80) with pod <pod> behind it
	ActionCreateBig      = "create-big"      // ?name=&n=: a ClusterIP Service with n endpoints no pod has
)

// SideBySideParams describe the side-by-side benchmark: the same workload, the same observer (the
// kernel's IPVS table, read by the agent) for every implementation, each run alternating their order.
type SideBySideParams struct {
	// Services is N: Service i has cluster IP BenchClusterIP(i), TCP port 80, and the endpoints
	// BenchEndpoints(i, 0) until the agent asks for a change.
	Services int `json:"services"`
	// Runs is how many times each implementation is measured; Changes how many one-Service changes
	// each run makes.
	Runs    int `json:"runs"`
	Changes int `json:"changes"`
	// Idle is how long the agent waits with nothing changing, to measure a periodic resync (longer than
	// the configured ipvs.syncPeriod).
	Idle string `json:"idle"`
	// Impls are the implementations, each a command line.
	Impls []BenchImpl `json:"impls"`
	// Profile, when set, has the agent take CPU profiles of the implementation named "ours" (which must
	// serve /debug/pprof on 127.0.0.1:10249: enableProfiling): one this long from its start (a duration:
	// "200s"), one over the idle period, sent as files ours-cold-<run>.pprof and ours-idle-<run>.pprof.
	// Profiling slows what it measures: such runs are for the profiles, not for the figures.
	Profile string `json:"profile,omitempty"`
}

// BenchImpl is one implementation of the side-by-side benchmark.
type BenchImpl struct {
	Name string   `json:"name"`
	Args []string `json:"args"`
}

// BenchPort is the benchmark Services' port, BenchTargetPort their endpoints'.
const (
	BenchPort       = 80
	BenchTargetPort = 8080
)

// BenchClusterIP is the cluster IP of benchmark Service i (i < 32768), in the harness's ServiceCIDR.
func BenchClusterIP(i int) netip.Addr {
	return addrAdd(netip.MustParseAddr("10.96.128.0"), uint32(i))
}

// BenchEndpoints are the three endpoint addresses of benchmark Service i at generation gen (0 at
// creation; each change moves the window by one, so one endpoint goes and one comes).
func BenchEndpoints(i, gen int) []netip.Addr {
	base := addrAdd(netip.MustParseAddr("10.200.0.0"), uint32(i)*64)
	out := make([]netip.Addr, 3)
	for j := range out {
		out[j] = addrAdd(base, uint32(gen%61+j+1))
	}
	return out
}

func addrAdd(a netip.Addr, n uint32) netip.Addr {
	b := a.As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]) + n
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// DaemonParams describe the daemon part of a VM run.
type DaemonParams struct {
	// Binary is the kube-proxy binary's path in the guest.
	Binary string `json:"binary"`
	// Config is the path of its configuration file in the guest.
	Config string `json:"config"`
	// ServiceIP is the cluster IP of the Service the host creates once the daemon runs; its EndpointSlice
	// lists PodIP(1) and PodIP(2) on port 80.
	ServiceIP string `json:"serviceIP"`
}

// Paths in the guest.
const (
	UpstreamPath   = "/kp/kube-proxy-upstream"
	ParamsPath     = "/kp/params.json"
	AgentPath      = "/kp/agent"
	DaemonPath     = "/kp/kube-proxy"
	ConfigPath     = "/kp/config.yaml"
	KubeconfigPath = "/kp/kubeconfig"
)

// Console protocol: the agent prints lines starting with Prefix; the rest is logs.
//
//	KPVM CASE <name> PASS|FAIL|SKIP <detail>   one dataplane case
//	KPVM BENCH <name> <seconds> <detail>       one benchmark figure
//	KPVM WAIT <what>                           the agent waits for the host (create-service, delete-service)
//	KPVM NOTE <text>                           something the host should log
//	KPVM FILE <name> <base64>                  a piece of a file for the host (pieces in order)
//	KPVM ROW <json>                            one fault table row (a faults.Row of package e2e/faults)
//	KPVM DONE <exit code>                      the agent finished
const Prefix = "KPVM "

// CaseNames are the dataplane cases the agent knows, in the order it runs them.
var CaseNames = []string{
	"clusterip-rr", "nodeport", "nodeport-new-address", "udp", "sh", "dh", "lc", "sed", "nq", "mh", "schedulers", "affinity",
	"graceful", "externalip", "source-ranges", "etp-local-no-local", "itp-local-no-local", "repair", "ipv6",
	"vip-port-reuse", "sysctls", "cleanup",
}

// The guest's addresses. Pod i (1-based) is 10.244.i.2 behind 10.244.i.1 on the VM ("node"); the clients
// are 10.250.0.2 and 10.251.0.2; the node's own address towards them is 10.250.0.1.
const (
	NodeName    = "vm-node"
	NodeIP      = "10.250.0.1"
	ClientIP    = "10.250.0.2"
	Client2IP   = "10.251.0.2"
	ClusterCIDR = "10.244.0.0/16"
)
