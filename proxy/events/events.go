// Package events records the Kubernetes Events kube-proxy reports about its node (events.k8s.io/v1,
// reporting controller kube-proxy, regarding the Node), with the reasons, types, actions and notes of
// upstream v1.37's cmd/kube-proxy/app.
//
// The Recorder writes them as client-go's event broadcaster (k8s.io/client-go/tools/events) writes them for
// upstream: the same object names, namespace, reporting instance and retries. It does not use that package:
// importing it links client-go's clientset and registers every API group Kubernetes has in a global scheme,
// which made the daemon 10.6 MB larger and cost 8 MiB of resident memory (21 to 29 MiB idle) for the few
// Events a kube-proxy records in its life. The broadcaster's one other duty, folding repeats of an event
// into an EventSeries, has nothing to do here: the node's Events are recorded at most once per process, and
// a Service's health-check failure once until its server listens (upstream records it at every sync and
// lets the broadcaster fold the repeats).
package events

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"kube-proxy/config"
)

// Controller is the reportingController of every Event, upstream's.
const Controller = "kube-proxy"

// ActionStart is the action of the Events recorded while kube-proxy starts, upstream's.
const ActionStart = "StartKubeProxy"

// ActionListen is the action of the Event about a Service's health-check server, upstream's.
const ActionListen = "Listen"

// The reasons of the Events upstream's cmd/kube-proxy/app records about the node, and (the last) its
// service health-check server about a Service.
const (
	// ReasonStarting (Normal) says kube-proxy started: its servers listen and it watches the API.
	ReasonStarting = "Starting"
	// ReasonDefaultMode (Warning) says the mode was left to the default, which changes in Kubernetes 1.40.
	ReasonDefaultMode = "KubeProxyDefaultMode"
	// ReasonIPVSDeprecation (Warning) says mode ipvs is deprecated.
	ReasonIPVSDeprecation = "IPVSDeprecation"
	// ReasonFailedHealthServer (Warning) says the health server could not listen, with bindAddressHardFail.
	ReasonFailedHealthServer = "FailedToStartProxierHealthcheck"
	// ReasonFailedMetricsServer (Warning) says the metrics server could not listen, with bindAddressHardFail.
	ReasonFailedMetricsServer = "FailedToStartMetricServer"
	// ReasonFailedServiceHealthcheck (Warning) says a Service's healthCheckNodePort server could not listen.
	ReasonFailedServiceHealthcheck = "FailedToStartServiceHealthcheck"
)

// The notes of the mode warnings: upstream's words, which operators' alerts may match.
const (
	defaultModeNote = "No kube-proxy mode specified: defaulting to 'iptables'. Note that in Kubernetes 1.40 the " +
		"default mode will switch to 'nftables'. If you wish to continue using 'iptables' mode, you must explicitly " +
		"specify 'mode: iptables' in the kube-proxy config file, or '--proxy-mode iptables' on the kube-proxy command line."
	ipvsDeprecationNote = "The ipvs proxier has been deprecated and will be disabled by default in Kubernetes 1.40 " +
		"and removed in Kubernetes 1.43. Migrate to the 'nftables' proxier instead."
)

// Warning is a Warning event about the configuration, recorded (and logged as an error) at start.
type Warning struct {
	Reason string
	Note   string
}

// StartWarnings returns what upstream kube-proxy warns about its mode when it starts: that the default,
// iptables, becomes nftables in Kubernetes 1.40 (when modeDefaulted: neither the file nor --proxy-mode
// named a mode; KEP-5343), and that mode ipvs is deprecated (KEP-5495).
func StartWarnings(mode config.ProxyMode, modeDefaulted bool) []Warning {
	var out []Warning
	if modeDefaulted && mode == config.ModeIPTables {
		out = append(out, Warning{Reason: ReasonDefaultMode, Note: defaultModeNote})
	}
	if mode == config.ModeIPVS {
		out = append(out, Warning{Reason: ReasonIPVSDeprecation, Note: ipvsDeprecationNote})
	}
	return out
}

// NodeRef is the reference upstream's Events about the node carry in regarding: the Node by name only.
func NodeRef(nodeName string) v1.ObjectReference {
	return v1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: nodeName}
}

// ServiceRef is the reference upstream's Events about a Service carry in regarding: by namespace and name.
func ServiceRef(nn types.NamespacedName) v1.ObjectReference {
	return v1.ObjectReference{APIVersion: "v1", Kind: "Service", Namespace: nn.Namespace, Name: nn.Name}
}

// Sink creates Events in the API server; proxy.API is one.
type Sink interface {
	CreateEvent(ctx context.Context, e *eventsv1.Event) (*eventsv1.Event, error)
}

// The broadcaster's limits: events waiting to be written, tries per event and the wait between two.
const (
	queueLength = 1000
	maxTries    = 12
	retryWait   = 10 * time.Second
)

// Recorder queues Events and writes them to a Sink in the background, from Start until Shutdown. Event
// never blocks and never fails: an Event the API server refuses (kube-proxy's user lacks the RBAC, say) is
// logged, the first refusal as an error, and dropped; one it cannot reach is tried again for up to two
// minutes, as client-go does, but not once Shutdown is called.
type Recorder struct {
	sink      Sink
	instance  string
	now       func() time.Time
	retryWait time.Duration

	mu      sync.Mutex
	queue   chan *eventsv1.Event
	started bool
	closed  bool

	ctx      context.Context // cancelled when Shutdown stops waiting
	cancel   context.CancelFunc
	stopping chan struct{} // closed by Shutdown: no more tries after a failed one
	done     chan struct{} // closed when the writer returns
	refused  atomic.Bool   // a refusal was logged as an error
}

// NewRecorder returns a Recorder writing to sink (nil: Events are dropped) with reportingInstance
// kube-proxy-HOSTNAME, as upstream names it from the host's name (not the node's).
func NewRecorder(sink Sink, hostname string) *Recorder {
	ctx, cancel := context.WithCancel(context.Background())
	return &Recorder{
		sink:      sink,
		instance:  Controller + "-" + hostname,
		now:       time.Now,
		retryWait: retryWait,
		queue:     make(chan *eventsv1.Event, queueLength),
		ctx:       ctx,
		cancel:    cancel,
		stopping:  make(chan struct{}),
		done:      make(chan struct{}),
	}
}

// Event records an Event about regarding of type eventtype (v1.EventTypeNormal or v1.EventTypeWarning).
// It is written once Start has been called, also when recorded before.
func (r *Recorder) Event(regarding v1.ObjectReference, eventtype, reason, action, note string) {
	if r == nil || r.sink == nil {
		return
	}
	e := r.makeEvent(regarding, eventtype, reason, action, note)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		klog.V(2).InfoS("Event not written: shutting down", "reason", reason, "note", note)
		return
	}
	select {
	case r.queue <- e:
	default:
		klog.V(2).InfoS("Event dropped: too many waiting to be written", "reason", reason, "note", note)
	}
}

// makeEvent is the Event client-go's recorder makes: named after the object and the time in hexadecimal
// nanoseconds, in the object's namespace or "default" for a cluster-scoped one such as a Node.
func (r *Recorder) makeEvent(regarding v1.ObjectReference, eventtype, reason, action, note string) *eventsv1.Event {
	now := r.now()
	namespace := regarding.Namespace
	if namespace == "" {
		namespace = metav1.NamespaceDefault
	}
	return &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{
			Name:      regarding.Name + "." + strconv.FormatInt(now.UnixNano(), 16),
			Namespace: namespace,
		},
		EventTime:           metav1.MicroTime{Time: now},
		ReportingController: Controller,
		ReportingInstance:   r.instance,
		Action:              action,
		Reason:              reason,
		Regarding:           regarding,
		Note:                note,
		Type:                eventtype,
	}
}

// Start starts writing the recorded Events. It does nothing after the first call or after Shutdown.
func (r *Recorder) Start() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started || r.closed {
		return
	}
	r.started = true
	go func() {
		defer close(r.done)
		for e := range r.queue {
			r.write(e)
		}
	}()
}

// Shutdown stops taking Events and gives those recorded up to timeout for one last try each (a server
// that could not be reached is not waited for); what is left then is dropped. Later calls do nothing.
func (r *Recorder) Shutdown(timeout time.Duration) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	close(r.queue)
	close(r.stopping)
	started := r.started
	r.mu.Unlock()
	if !started {
		r.cancel()
		return
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-r.done:
	case <-t.C:
		if n := len(r.queue); n > 0 {
			klog.InfoS("Events not written before the deadline", "dropped", n)
		}
	}
	r.cancel()
	<-r.done
}

// write creates e, trying again while the API server cannot be reached, as client-go's broadcaster does.
func (r *Recorder) write(e *eventsv1.Event) {
	for try := 1; ; try++ {
		_, err := r.sink.CreateEvent(r.ctx, e)
		if err == nil {
			klog.V(4).InfoS("Event written", "reason", e.Reason, "event", klog.KObj(e))
			return
		}
		var construction *rest.RequestConstructionError
		var status apierrors.APIStatus
		switch {
		case errors.As(err, &status):
			r.logRefusal(e, err)
			return
		case errors.As(err, &construction):
			klog.ErrorS(err, "Event not written: the request cannot be made", "reason", e.Reason)
			return
		case r.ctx.Err() != nil || r.isStopping():
			klog.V(2).InfoS("Event not written: shutting down", "reason", e.Reason, "err", err)
			return
		case try == maxTries:
			klog.ErrorS(err, "Event not written: the API server could not be reached", "reason", e.Reason, "tries", try)
			return
		}
		klog.V(2).InfoS("Event not written yet; trying again", "reason", e.Reason, "err", err, "try", try)
		select {
		case <-r.stopping:
			klog.V(2).InfoS("Event not written: shutting down", "reason", e.Reason)
			return
		case <-time.After(wait.Jitter(r.retryWait, 0.25)):
		}
	}
}

func (r *Recorder) isStopping() bool {
	select {
	case <-r.stopping:
		return true
	default:
		return false
	}
}

// logRefusal logs an Event the API server refused: the first as an error that says what RBAC the Events
// need, later ones at verbosity 2, since they have the same cause.
func (r *Recorder) logRefusal(e *eventsv1.Event, err error) {
	switch {
	case apierrors.IsAlreadyExists(err):
		klog.V(5).InfoS("Event already written", "event", klog.KObj(e))
	case r.refused.CompareAndSwap(false, true):
		klog.ErrorS(err, "The API server refused an Event; kube-proxy's user needs to create events.k8s.io "+
			"events (ClusterRole system:node-proxier allows it). Later refusals are logged at verbosity 2",
			"reason", e.Reason, "event", klog.KObj(e))
	default:
		klog.V(2).InfoS("The API server refused an Event", "reason", e.Reason, "err", err)
	}
}
