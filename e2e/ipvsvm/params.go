package ipvsvm

// Params tell the guest agent what to run; the host writes them to ParamsPath in the initramfs.
type Params struct {
	// Cases are the dataplane cases to run, by name; empty runs them all (see CaseNames).
	Cases []string `json:"cases,omitempty"`
	// Bench is the number of Services (3 real servers each) of the sync benchmark; 0 skips it.
	Bench int `json:"bench,omitempty"`
	// Daemon, when set, runs a kube-proxy daemon in IPVS mode against the host's apiserver.
	Daemon *DaemonParams `json:"daemon,omitempty"`
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
//	KPVM DONE <exit code>                      the agent finished
const Prefix = "KPVM "

// CaseNames are the dataplane cases the agent knows, in the order it runs them.
var CaseNames = []string{
	"clusterip-rr", "nodeport", "nodeport-new-address", "udp", "sh", "dh", "lc", "sed", "nq", "mh", "schedulers", "affinity",
	"graceful", "externalip", "source-ranges", "etp-local-no-local", "itp-local-no-local", "repair", "ipv6",
	"sysctls", "cleanup",
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
