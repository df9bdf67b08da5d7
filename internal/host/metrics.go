package host

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
)

// metrics are the Host's own measures beside its HTTP layer's, for the alerts an on-call needs
// (README, "Alerts"): what the janitor settled or failed, and every call to a backend.
type metrics struct {
	settled      *prometheus.CounterVec
	stepFailures *prometheus.CounterVec
	calls        *prometheus.CounterVec
	callTime     *prometheus.HistogramVec
	reachable    *prometheus.GaugeVec
	reconciled   *prometheus.CounterVec
	ticks        *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		settled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "takoserver_janitor_settled_total",
			Help: "Rows each janitor step settled: recover counts operations of stopped Hosts it finished, orphans deployments it took down, and so on.",
		}, []string{"step"}),
		stepFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "takoserver_janitor_failures_total",
			Help: "Janitor steps that failed, by step.",
		}, []string{"step"}),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "takoserver_backend_calls_total",
			Help: "Calls from this Host to a backend (a runtime node, Cloudflare), by installation, call (apply, delete, observe, observe_change) and outcome (ok, unreachable, refused). A refused apply is a failed deploy.",
		}, []string{"installation", "call", "outcome"}),
		callTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "takoserver_backend_call_duration_seconds",
			Help:    "Time of the calls from this Host to a backend, by installation and call (held reads excluded).",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"installation", "call"}),
		reachable: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "takoserver_backend_reachable",
			Help: "1 when the runtime node of a selfhost installation answered the janitor's last probe, 0 when it could not be asked.",
		}, []string{"installation"}),
	}
	m.reconciled = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "takoserver_node_reconciled_total",
		Help: "Objects the janitor changed on a runtime node to put it back to what the ledger says, by installation, kind (worker, endpoint) and action: restored (written again), removed (the ledger deleted it), fenced (the ledger has no record of it: the database was restored to an earlier point). Any fenced object deserves a look.",
	}, []string{"installation", "kind", "action"})
	m.ticks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "takoserver_cron_ticks_total",
		Help: "Cron ticks this Host claimed on selfhost installations, by outcome: ok, exception (the handler threw), failed (no node ran it), missed (more than 60 s late: no Host ran ticks when due), braked.",
	}, []string{"outcome"})
	for _, o := range []string{"ok", "exception", "failed", "missed", "braked"} {
		m.ticks.WithLabelValues(o)
	}
	reg.MustRegister(m.settled, m.stepFailures, m.calls, m.callTime, m.reachable, m.reconciled, m.ticks)
	for _, s := range (&Host{}).steps() {
		m.settled.WithLabelValues(s.name)
		m.stepFailures.WithLabelValues(s.name)
	}
	return m
}

// seen is the backends' Seen: one call counted and timed.
func (m *metrics) seen(installation, call string, took time.Duration, outcome string) {
	m.calls.WithLabelValues(installation, call, outcome).Inc()
	if took > 0 {
		m.callTime.WithLabelValues(installation, call).Observe(took.Seconds())
	}
}

// newRegistry is a Host process's one registry: the Go runtime's and the process's collectors,
// then each layer's own.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// leases counts the requests in flight by the state of their leases, read at each scrape: a
// growing count of expired ones is a Host that stopped mid-request and that nothing recovers.
type leases struct {
	db   *pgxpool.Pool
	desc *prometheus.Desc
}

func newLeases(db *pgxpool.Pool) *leases {
	return &leases{db: db, desc: prometheus.NewDesc("takoserver_ownership_leases",
		"Requests in flight on every replica, by the state of their lease: live (being worked on) or expired (their Host stopped; the next request on the object or the janitor recovers them).",
		[]string{"state"}, nil)}
}

func (l *leases) Describe(ch chan<- *prometheus.Desc) { ch <- l.desc }

func (l *leases) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c, err := dbsqlc.New(l.db).OwnershipLeaseCounts(ctx)
	if err != nil {
		return // the database does not answer: /readyz and the request metrics say so
	}
	ch <- prometheus.MustNewConstMetric(l.desc, prometheus.GaugeValue, float64(c.Live), "live")
	ch <- prometheus.MustNewConstMetric(l.desc, prometheus.GaugeValue, float64(c.Expired), "expired")
}
