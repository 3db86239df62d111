package rules

import (
	"context"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"kube-proxy/config"
	"kube-proxy/proxy"
)

// afterFirstSync wraps dps so that cleanup runs once, in the background, after every family's first
// successful sync.
func afterFirstSync(ctx context.Context, dps []proxy.FamilyDataplane, what string, cleanup func(context.Context) error) []proxy.FamilyDataplane {
	fs := &firstSync{pending: map[v1.IPFamily]bool{}, run: func() {
		start := time.Now()
		if err := cleanup(ctx); err != nil {
			klog.ErrorS(err, "Could not remove what other modes left", "what", what)
			return
		}
		klog.V(2).InfoS("Removed what other modes left, if anything", "what", what, "elapsed", time.Since(start))
	}}
	out := make([]proxy.FamilyDataplane, len(dps))
	for i, d := range dps {
		fs.pending[d.Family] = true
		out[i] = proxy.FamilyDataplane{Family: d.Family, Dataplane: &syncNotifier{Dataplane: d.Dataplane, family: d.Family, fs: fs}}
	}
	return out
}

// firstSync runs run once all pending families have synced.
type firstSync struct {
	mu      sync.Mutex
	pending map[v1.IPFamily]bool
	run     func()
}

func (fs *firstSync) synced(f v1.IPFamily) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if !fs.pending[f] {
		return
	}
	delete(fs.pending, f)
	if len(fs.pending) == 0 {
		go fs.run()
	}
}

// syncNotifier is a dataplane that reports its first successful sync; it passes reloads, watches and
// stops on.
type syncNotifier struct {
	proxy.Dataplane
	family v1.IPFamily
	fs     *firstSync
}

func (s *syncNotifier) Apply(ctx context.Context, snap *proxy.Snapshot, full bool) error {
	err := s.Dataplane.Apply(ctx, snap, full)
	if err == nil {
		s.fs.synced(s.family)
	}
	return err
}

func (s *syncNotifier) Reconfigure(cfg *config.KubeProxyConfiguration) error {
	if r, ok := s.Dataplane.(proxy.Reconfigurer); ok {
		return r.Reconfigure(cfg)
	}
	return nil
}

func (s *syncNotifier) Stop(ctx context.Context) {
	if st, ok := s.Dataplane.(proxy.Stopper); ok {
		st.Stop(ctx)
	}
}

func (s *syncNotifier) Watch(ctx context.Context, interval time.Duration, sync func(full bool)) {
	if w, ok := s.Dataplane.(proxy.Watcher); ok {
		w.Watch(ctx, interval, sync)
	}
}
