package runtime

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics exports the node's restarts (counted as they happen) and, read at scrape time from the
// live state, its incidents and Ready incarnations. The edge adds its requests by status.
type metrics struct {
	n        *Node
	restarts *prometheus.CounterVec
	incident *prometheus.Desc
	ready    *prometheus.Desc
	scripts  *prometheus.Desc
}

func newMetrics(n *Node) *metrics {
	return &metrics{
		n: n,
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "takoform_runtime_restarts_total",
			Help: "Restarts of incarnations by continuity, by script.",
		}, []string{"script"}),
		incident: prometheus.NewDesc("takoform_runtime_incident",
			"1 while a script's serving incarnation has restarted six times within an hour (retries continue).", []string{"script"}, nil),
		ready: prometheus.NewDesc("takoform_runtime_ready_incarnations",
			"Incarnations that are Ready (process running and probe answered).", nil, nil),
		scripts: prometheus.NewDesc("takoform_runtime_scripts",
			"Scripts in the desired state.", nil, nil),
	}
}

func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	m.restarts.Describe(ch)
	ch <- m.incident
	ch <- m.ready
	ch <- m.scripts
}

func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	m.restarts.Collect(ch)
	m.n.mu.RLock()
	defer m.n.mu.RUnlock()
	ready := 0
	for name, r := range m.n.scripts {
		for _, inc := range r.incarnations() {
			if inc.Ready() {
				ready++
			}
		}
		incident := 0.0
		if r.serving != nil && r.serving.inc.Status().Incident {
			incident = 1
		}
		ch <- prometheus.MustNewConstMetric(m.incident, prometheus.GaugeValue, incident, name)
	}
	ch <- prometheus.MustNewConstMetric(m.ready, prometheus.GaugeValue, float64(ready))
	ch <- prometheus.MustNewConstMetric(m.scripts, prometheus.GaugeValue, float64(len(m.n.desired.Scripts)))
}
