package edge

import (
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// BenchmarkMeasure is what the per-organization measures add to each request the edge carries to
// a worker: one lookup of the organization's counters, a counter and a histogram.
func BenchmarkMeasure(b *testing.B) {
	h := New(nil, prometheus.NewRegistry(), nil, Limits{})
	h.measure("org-1", http.StatusOK, time.Millisecond)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			h.measure("org-1", http.StatusOK, time.Millisecond)
		}
	})
}
