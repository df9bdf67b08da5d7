package edge

import (
	"bufio"
	"bytes"
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// A worker's subrequest arrives from workerd's loopback connection: even with the loopback among
// the trusted proxies (a local TLS terminator), what it claims in forwarding headers is replaced,
// so no tenant's worker passes for another client address or for HTTPS at another tenant's worker.
func TestAWorkersSubrequestIsNeverATrustedProxy(t *testing.T) {
	t.Parallel()
	trusted, err := ParseTrustedProxies([]string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	h := New(nil, prometheus.NewRegistry(), nil, Limits{TrustedProxies: trusted})
	headers := func(r *httptest.ResponseRecorder, fromWorker bool) string {
		req := httptest.NewRequest("GET", "http://victim.workers.localhost/", nil)
		req.RemoteAddr = "127.0.0.1:40000"
		req.Header.Set("X-Forwarded-For", "6.6.6.6")
		req.Header.Set("X-Forwarded-Proto", "https")
		if fromWorker {
			req = req.WithContext(context.WithValue(req.Context(), fromWorkerKey{}, true))
		}
		var b bytes.Buffer
		bw := bufio.NewWriter(&b)
		h.forwarded(bw, req)
		_ = bw.Flush()
		return b.String()
	}
	if got := headers(nil, false); !strings.Contains(got, "X-Forwarded-For: 6.6.6.6, 127.0.0.1") {
		t.Fatalf("a trusted proxy's X-Forwarded-For is appended to:\n%s", got)
	}
	got := headers(nil, true)
	if strings.Contains(got, "6.6.6.6") || strings.Contains(got, "https") {
		t.Fatalf("a worker's subrequest was believed:\n%s", got)
	}
}
