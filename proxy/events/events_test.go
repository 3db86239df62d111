package events

import (
	"bytes"
	"context"
	"errors"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	v1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"

	"kube-proxy/config"
	"kube-proxy/proxy/apitest"
)

// api is a fake API server (client-go's fake clientset, which keeps what it is given) behind the daemon's
// API interface, with a hook that may fail a create the way the real one would.
type api struct {
	*apitest.Clientset
	cs *fake.Clientset

	mu    sync.Mutex
	fail  func(try int) error // the try-th create (from 1) fails with what it returns, if not nil
	tries int
}

func newAPI() *api {
	a := &api{cs: fake.NewClientset()}
	a.Clientset = apitest.New(a.cs)
	a.cs.PrependReactor("create", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.tries++
		if a.fail != nil {
			if err := a.fail(a.tries); err != nil {
				return true, nil, err
			}
		}
		return false, nil, nil // on to the object tracker
	})
	return a
}

func (a *api) triesSoFar() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.tries
}

func (a *api) setFail(f func(try int) error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.fail = f
}

func (a *api) events(t *testing.T) []eventsv1.Event {
	t.Helper()
	l, err := a.cs.EventsV1().Events("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

var forbidden = apierrors.NewForbidden(schema.GroupResource{Group: "events.k8s.io", Resource: "events"}, "",
	errors.New(`User "system:kube-proxy" cannot create resource "events" in API group "events.k8s.io"`))

// TestRecorderWritesUpstreamsEvents: an Event recorded before Start is written once the recorder starts,
// as client-go's recorder makes it for upstream kube-proxy: named after the node and the time in hex
// nanoseconds, in namespace default, reporting controller kube-proxy, instance kube-proxy-HOSTNAME.
func TestRecorderWritesUpstreamsEvents(t *testing.T) {
	a := newAPI()
	r := NewRecorder(a, "host-1")
	at := time.Date(2026, 12, 5, 8, 0, 0, 123456789, time.UTC)
	r.now = func() time.Time { return at }
	r.Event(NodeRef("node-a"), v1.EventTypeWarning, ReasonDefaultMode, ActionStart, "a note")
	r.Start()
	r.Shutdown(10 * time.Second)

	got := a.events(t)
	if len(got) != 1 {
		t.Fatalf("%d events written, want 1: %+v", len(got), got)
	}
	e := got[0]
	want := eventsv1.Event{
		ObjectMeta:          metav1.ObjectMeta{Name: "node-a.18ee4cab5568cd15", Namespace: "default"},
		EventTime:           metav1.MicroTime{Time: at},
		ReportingController: "kube-proxy",
		ReportingInstance:   "kube-proxy-host-1",
		Action:              "StartKubeProxy",
		Reason:              "KubeProxyDefaultMode",
		Regarding:           v1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: "node-a"},
		Note:                "a note",
		Type:                "Warning",
	}
	if !e.EventTime.Equal(&want.EventTime) {
		t.Errorf("eventTime %v, want %v", e.EventTime, want.EventTime)
	}
	e.EventTime = want.EventTime
	e.ManagedFields = nil // the fake's bookkeeping
	if e.String() != want.String() {
		t.Errorf("event written:\n%s\nwant:\n%s", e.String(), want.String())
	}
}

// captureLog sends klog's output to a buffer for the test's duration, one line per entry, errors marked.
func captureLog(t *testing.T) *syncBuffer {
	t.Helper()
	buf := &syncBuffer{}
	klog.SetLogger(funcr.New(func(prefix, args string) {
		buf.Write([]byte(prefix + " " + args + "\n"))
	}, funcr.Options{}))
	t.Cleanup(klog.ClearLogger)
	return buf
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestRecorderRefusals: Events the API server refuses (the user lacks the RBAC) are dropped without a
// retry, and only the first refusal is logged as an error; the daemon goes on.
func TestRecorderRefusals(t *testing.T) {
	logs := captureLog(t)
	a := newAPI()
	a.setFail(func(int) error { return forbidden })
	r := NewRecorder(a, "host-1")
	r.retryWait = time.Millisecond
	r.Start()
	for _, reason := range []string{ReasonDefaultMode, ReasonStarting, ReasonFailedHealthServer} {
		r.Event(NodeRef("node-a"), v1.EventTypeNormal, reason, ActionStart, "")
	}
	r.Shutdown(10 * time.Second)
	klog.Flush()

	if n := len(a.events(t)); n != 0 {
		t.Errorf("%d refused events stored", n)
	}
	if a.tries != 3 {
		t.Errorf("%d tries for 3 refused events, want 3 (a refusal is not retried)", a.tries)
	}
	errorLines := regexp.MustCompile(`(?m)^.*refused an Event.*$`).FindAllString(logs.String(), -1)
	if len(errorLines) != 1 || !strings.Contains(errorLines[0], `"error"=`) || !strings.Contains(errorLines[0], "create events.k8s.io events") {
		t.Errorf("error lines about refusals: %q, want one saying what RBAC is needed\nlog:\n%s", errorLines, logs)
	}
}

// TestRecorderRetriesUnreachableServer: while the API server cannot be reached, an Event is tried again,
// and written once it can be; a duplicate name (the first try got through after all) ends the tries.
func TestRecorderRetriesUnreachableServer(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fail  func(try int) error
		tries int
	}{
		{name: "connection refused twice", tries: 3, fail: func(try int) error {
			if try <= 2 {
				return errors.New("dial tcp 127.0.0.1:6443: connect: connection refused")
			}
			return nil
		}},
		{name: "the server said nothing, yet wrote it", tries: 2, fail: func(try int) error {
			if try == 1 {
				return errors.New("http2: server sent GOAWAY and closed the connection")
			}
			return apierrors.NewAlreadyExists(schema.GroupResource{Group: "events.k8s.io", Resource: "events"}, "node-a.1")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newAPI()
			a.setFail(tc.fail)
			r := NewRecorder(a, "host-1")
			r.retryWait = time.Millisecond
			r.Start()
			r.Event(NodeRef("node-a"), v1.EventTypeNormal, ReasonStarting, ActionStart, "")
			for deadline := time.Now().Add(10 * time.Second); a.triesSoFar() < tc.tries && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
			time.Sleep(20 * time.Millisecond) // room for a try too many
			r.Shutdown(10 * time.Second)
			if a.tries != tc.tries {
				t.Errorf("%d tries, want %d", a.tries, tc.tries)
			}
			if got := a.events(t); tc.tries == 3 && (len(got) != 1 || got[0].Reason != ReasonStarting) {
				t.Errorf("events written: %+v", got)
			}
		})
	}
}

// blockingAPI is an API server that takes a create but never answers until the request is given up.
type blockingAPI struct{ *api }

func (b blockingAPI) CreateEvent(ctx context.Context, _ *eventsv1.Event) (*eventsv1.Event, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestRecorderShutdownIsBounded: a stop is not held up by an API server that cannot be reached (an Event
// waiting to be tried again is given up at once) nor by one that does not answer (given up after the
// timeout), and an Event recorded after Shutdown is dropped.
func TestRecorderShutdownIsBounded(t *testing.T) {
	for _, tc := range []struct {
		name    string
		sink    func(a *api) Sink
		timeout time.Duration
		within  time.Duration
	}{
		{name: "unreachable, waiting to try again", timeout: time.Hour, within: 5 * time.Second, sink: func(a *api) Sink {
			a.setFail(func(int) error { return errors.New("dial tcp 127.0.0.1:6443: connect: connection refused") })
			return a
		}},
		{name: "not answering", timeout: 50 * time.Millisecond, within: 5 * time.Second, sink: func(a *api) Sink { return blockingAPI{a} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newAPI()
			r := NewRecorder(tc.sink(a), "host-1")
			r.retryWait = time.Hour
			r.Start()
			r.Event(NodeRef("node-a"), v1.EventTypeNormal, ReasonStarting, ActionStart, "")
			time.Sleep(20 * time.Millisecond) // the first try is made
			start := time.Now()
			r.Shutdown(tc.timeout)
			if d := time.Since(start); d > tc.within {
				t.Errorf("Shutdown took %v", d)
			}
			r.Event(NodeRef("node-a"), v1.EventTypeNormal, ReasonStarting, ActionStart, "")
			r.Shutdown(time.Second) // again: nothing to do
			if n := len(a.events(t)); n != 0 {
				t.Errorf("%d events written", n)
			}
		})
	}
}

// TestRecorderWithoutSink: without an API (tests, --init-only), recording does nothing and needs no Start.
func TestRecorderWithoutSink(t *testing.T) {
	r := NewRecorder(nil, "host-1")
	r.Event(NodeRef("node-a"), v1.EventTypeNormal, ReasonStarting, ActionStart, "")
	r.Start()
	r.Shutdown(time.Second)
}

// TestStartWarnings: upstream warns about a defaulted mode (iptables, whose default status ends in 1.40)
// and about mode ipvs, whatever chose it; other modes and an explicit iptables get no warning.
func TestStartWarnings(t *testing.T) {
	for _, tc := range []struct {
		mode      config.ProxyMode
		defaulted bool
		want      []string // reasons
		note      string   // a part of the first note
	}{
		{mode: config.ModeIPTables, defaulted: true, want: []string{"KubeProxyDefaultMode"},
			note: "No kube-proxy mode specified: defaulting to 'iptables'. Note that in Kubernetes 1.40 the default mode will switch to 'nftables'."},
		{mode: config.ModeIPTables},
		{mode: config.ModeIPVS, want: []string{"IPVSDeprecation"},
			note: "The ipvs proxier has been deprecated and will be disabled by default in Kubernetes 1.40 and removed in Kubernetes 1.43."},
		{mode: config.ModeNFTables},
		{mode: config.ModeUserspace},
	} {
		got := StartWarnings(tc.mode, tc.defaulted)
		var reasons []string
		for _, w := range got {
			reasons = append(reasons, w.Reason)
		}
		if strings.Join(reasons, ",") != strings.Join(tc.want, ",") {
			t.Errorf("mode %s (defaulted %v): reasons %v, want %v", tc.mode, tc.defaulted, reasons, tc.want)
			continue
		}
		if tc.note != "" && !strings.Contains(got[0].Note, tc.note) {
			t.Errorf("mode %s: note %q does not say %q", tc.mode, got[0].Note, tc.note)
		}
	}
}
