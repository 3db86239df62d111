package engine

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the engine's collectors, kubeproxy_userspace_*, labelled by protocol (TCP, UDP).
type Metrics struct {
	accepted   *prometheus.CounterVec
	active     *prometheus.GaugeVec
	failedOver *prometheus.CounterVec
	failed     *prometheus.CounterVec
	refused    *prometheus.CounterVec
	bytes      *prometheus.CounterVec
	draining   *prometheus.GaugeVec
	drained    *prometheus.CounterVec
	listeners  *prometheus.GaugeVec
}

// NewMetrics registers the engine's collectors on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	const sub = "kubeproxy"
	m := &Metrics{
		accepted: prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: sub, Name: "userspace_connections_accepted_total",
			Help: "Connections (TCP) and flows (UDP, one per client address) accepted by the userspace proxy"}, []string{"protocol"}),
		active: prometheus.NewGaugeVec(prometheus.GaugeOpts{Subsystem: sub, Name: "userspace_connections_active",
			Help: "Connections (TCP) and flows (UDP) the userspace proxy is forwarding now"}, []string{"protocol"}),
		failedOver: prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: sub, Name: "userspace_connections_failed_over_total",
			Help: "Connection attempts to an endpoint that failed or timed out, after which the next endpoint was tried"}, []string{"protocol"}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: sub, Name: "userspace_connections_failed_total",
			Help: "Accepted connections closed because no endpoint could be reached"}, []string{"protocol"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: sub, Name: "userspace_connections_refused_total",
			Help: "Connections reset at once because a concurrency limit was reached (limit: service or total)"}, []string{"protocol", "limit"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: sub, Name: "userspace_bytes_total",
			Help: "Bytes copied by the userspace proxy (direction: to_endpoint, to_client); TCP counts when a direction ends"}, []string{"protocol", "direction"}),
		draining: prometheus.NewGaugeVec(prometheus.GaugeOpts{Subsystem: sub, Name: "userspace_connections_draining",
			Help: "Established connections whose endpoint was removed from the Service, left to end on their own"}, []string{"protocol"}),
		drained: prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: sub, Name: "userspace_connections_drained_total",
			Help: "Connections that ended after their endpoint had been removed from the Service"}, []string{"protocol"}),
		listeners: prometheus.NewGaugeVec(prometheus.GaugeOpts{Subsystem: sub, Name: "userspace_listeners",
			Help: "Listeners the userspace proxy has open, one per Service port and endpoint selection"}, []string{"protocol"}),
	}
	reg.MustRegister(m.accepted, m.active, m.failedOver, m.failed, m.refused, m.bytes, m.draining, m.drained, m.listeners)
	for _, p := range []string{"TCP", "UDP"} {
		m.accepted.WithLabelValues(p)
		m.active.WithLabelValues(p)
		m.failedOver.WithLabelValues(p)
		m.failed.WithLabelValues(p)
		m.refused.WithLabelValues(p, limitService)
		m.refused.WithLabelValues(p, limitTotal)
		m.bytes.WithLabelValues(p, toEndpoint)
		m.bytes.WithLabelValues(p, toClient)
		m.draining.WithLabelValues(p)
		m.drained.WithLabelValues(p)
		m.listeners.WithLabelValues(p)
	}
	return m
}

const (
	limitService = "service"
	limitTotal   = "total"
	toEndpoint   = "to_endpoint"
	toClient     = "to_client"
)
