package nfacct

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"
)

// Reader reads one counter (a *Client).
type Reader interface {
	Get(name string) (Counter, error)
}

// Collector exports the packet count of one counter, read from the kernel at every scrape, as a
// Prometheus counter without labels. A counter that does not exist (yet) exports nothing.
type Collector struct {
	r       Reader
	counter string
	desc    *prometheus.Desc
}

var _ prometheus.Collector = (*Collector)(nil)

// NewCollector returns the collector of counter, exported as desc.
func NewCollector(r Reader, counter string, desc *prometheus.Desc) *Collector {
	return &Collector{r: r, counter: counter, desc: desc}
}

// Describe sends the metric's description.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect reads the counter and sends its packet count.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ctr, err := c.r.Get(c.counter)
	switch {
	case errors.Is(err, ErrNotFound):
		klog.V(4).InfoS("nfacct counter not created yet; not exported", "counter", c.counter)
		return
	case err != nil:
		klog.ErrorS(err, "Could not read an nfacct counter for its metric", "counter", c.counter)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(ctr.Packets))
}
