package edge_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/edge"
)

// An HTTP/2 request without a body (a GET: no DATA frames, ContentLength 0, though its Body is not
// http.NoBody) reaches the worker as a plain request, with no chunked body the edge writes beside
// reading the answer: a worker that answers and closes its connection at once is answered 200.
// (The edge once sent every such request chunked, and a write the closed connection refused ended
// the read of the answer already there: a 502 now and then, seen in CI.)
func TestABodilessHTTP2RequestReachesTheWorkerWithoutABody(t *testing.T) {
	t.Parallel()
	up, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { up.Close() })
	heads := make(chan string, 8)
	go func() {
		for {
			c, err := up.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				var head strings.Builder
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						return
					}
					head.WriteString(line)
					if line == "\r\n" {
						break
					}
				}
				heads <- head.String()
				_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
			}()
		}
	}()
	h := edge.New(stubResolver{"w.test": deadTarget{up.Addr().String()}}, nil, nil, edge.Limits{})
	srv := httptest.NewUnstartedServer(h)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)

	for range 5 {
		req, err := http.NewRequest(http.MethodGet, srv.URL+"/", nil)
		require.NoError(t, err)
		req.Host = "w.test"
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, 2, resp.ProtoMajor)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
		require.Equal(t, "ok", string(body))
		head := strings.ToLower(<-heads)
		require.NotContains(t, head, "transfer-encoding", "the worker is sent no body")
		require.NotContains(t, head, "content-length")
	}
}
