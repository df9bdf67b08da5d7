package runtime_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/edge"
)

// echoSource answers what it received: method, path, body length and headers (as JSON).
const echoSource = `export default {
  async fetch(req) {
    const u = new URL(req.url);
    if (u.pathname === "/loop") { while (true) {} }
    if (req.headers.get("upgrade") === "websocket") {
      const [client, server] = Object.values(new WebSocketPair());
      server.accept();
      server.addEventListener("message", (e) => server.send("echo:" + e.data));
      return new Response(null, { status: 101, webSocket: client });
    }
    let length = 0;
    if (req.body) length = (await req.arrayBuffer()).byteLength;
    const headers = {};
    for (const [k, v] of req.headers) headers[k] = v;
    return Response.json({ method: req.method, scheme: u.protocol, path: u.pathname, length, headers });
  }
};`

type echoed struct {
	Method string `json:"method"`
	// Scheme is the worker's request.url scheme: workerd takes it from the X-Forwarded-Proto the
	// edge sets (its socket's forwardedProtoHeader), and does not pass that header on.
	Scheme  string            `json:"scheme"`
	Path    string            `json:"path"`
	Length  int               `json:"length"`
	Headers map[string]string `json:"headers"`
}

const (
	echoHost = "echo.workers.localhost"
	spinHost = "spin.workers.localhost"
)

// edgeLimits are short versions of the edge's limits, so that each can be seen to act.
var edgeLimits = edge.Limits{
	IdleTimeout: time.Second, HeaderTimeout: time.Second, BodyTimeout: time.Second, ResponseTimeout: 2 * time.Second,
	MaxBodyBytes: 1 << 20, TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")},
}

// TestEdgeLimits holds one subtest per limit of the edge (SPEC 5.1), against one node with real
// workerd and its sandbox.
func TestEdgeLimits(t *testing.T) {
	t.Parallel()
	f := setup(t, func(c *runtime.Config) {
		c.Edge = edgeLimits
		// The looping worker's process is killed by liveness (three missed probes, ≥ 6 s) well
		// after the response time limit, so that its kill can never pass for the limit.
		c.LivenessPeriod, c.LivenessTimeout = 2*time.Second, time.Second
	})
	f.putSource("echo", "uid-echo", echoSource)
	f.route(echoHost, "echo", "ep-echo")
	// Its own organization: a worker in a loop holds its organization's process, and the other
	// subtests go on meanwhile.
	f.orgScript("spin", "org-spin", "uid-spin", echoSource)
	f.route(spinHost, "spin", "ep-spin")
	f.waitReady("echo")
	f.waitReady("spin")
	// What no edge error may name.
	internal := []string{f.h.StateDir, "127.0.0.1", "workerd", "dial", "EOF", "tcp", "incarnation", "main.js"}
	for _, name := range []string{"echo", "spin"} {
		st, err := f.client.GetScript(f.ctx, name)
		require.NoError(t, err)
		internal = append(internal, st.Incarnation.Address, st.Incarnation.ID)
	}
	problem := func(t *testing.T, body, code string) {
		t.Helper()
		var p adminapi.Problem
		require.NoError(t, json.Unmarshal([]byte(body), &p), "%s", body)
		require.Equal(t, code, p.Code)
		for _, s := range internal {
			require.NotContains(t, body, s, "an edge error names something internal")
		}
	}

	t.Run("a looping worker's request ends with 504 at the response time limit", func(t *testing.T) {
		began := time.Now()
		code, body, _ := get(t, spinHost, "/loop", nil, 10*time.Second, f.h.Info.EdgeAddr)
		took := time.Since(began)
		require.Equal(t, http.StatusGatewayTimeout, code, "%s", body)
		problem(t, body, adminapi.CodeResponseTimeout)
		require.GreaterOrEqual(t, took, edgeLimits.ResponseTimeout)
		require.Less(t, took, edgeLimits.ResponseTimeout+time.Second, "answered at the limit")
	})

	t.Run("headers beyond 64 KiB are refused with 431", func(t *testing.T) {
		code, body, _ := get(t, echoHost, "/", http.Header{"X-Big": {strings.Repeat("a", 60<<10)}}, 5*time.Second, f.h.Info.EdgeAddr)
		require.Equal(t, http.StatusOK, code, "60 KiB of headers pass")
		code, body, _ = get(t, echoHost, "/", http.Header{"X-Big": {strings.Repeat("a", 65<<10)}}, 5*time.Second, f.h.Info.EdgeAddr)
		require.Equal(t, http.StatusRequestHeaderFieldsTooLarge, code)
		for _, s := range internal {
			require.NotContains(t, body, s)
		}
		// A 900 KB Host header, as in the issue.
		conn := dial(t, f.h.Info.EdgeAddr, "")
		_, _ = fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", strings.Repeat("h", 900_000))
		resp, _ := readResponse(t, conn)
		require.Equal(t, http.StatusRequestHeaderFieldsTooLarge, resp.StatusCode)
	})

	t.Run("a body beyond the limit is refused with 413, counted as it streams", func(t *testing.T) {
		code, body := post(t, f.h.Info.EdgeAddr, bytes.NewReader(make([]byte, 512<<10)))
		require.Equal(t, http.StatusOK, code, "%s", body)
		var e echoed
		require.NoError(t, json.Unmarshal([]byte(body), &e))
		require.Equal(t, 512<<10, e.Length)

		code, body = post(t, f.h.Info.EdgeAddr, bytes.NewReader(make([]byte, 2<<20)))
		require.Equal(t, http.StatusRequestEntityTooLarge, code, "declared by Content-Length")
		problem(t, body, adminapi.CodeBodyTooLarge)
		// No Content-Length: chunked, counted on the stream.
		code, body = post(t, f.h.Info.EdgeAddr, io.MultiReader(bytes.NewReader(make([]byte, 2<<20))))
		require.Equal(t, http.StatusRequestEntityTooLarge, code, "streamed")
		problem(t, body, adminapi.CodeBodyTooLarge)
	})

	t.Run("a body that trickles in on a connection the worker's process kept idle is cut at the body time limit too", func(t *testing.T) {
		// workerd closes a kept-alive connection that brings no request within 15 s: the edge
		// keeps no connection nearly that long, and sends a request's head before its body, so
		// that the process is on the request while the body trickles in (it once closed one
		// under a trickling body, and the client got 502).
		code, body, _ := get(t, echoHost, "/echo", nil, 5*time.Second, f.h.Info.EdgeAddr)
		require.Equal(t, http.StatusOK, code, body)
		time.Sleep(14500 * time.Millisecond) // the kept connection's idle time is what is tested
		conn := dial(t, f.h.Info.EdgeAddr, "")
		_, err := fmt.Fprintf(conn, "POST /echo HTTP/1.1\r\nHost: %s\r\nContent-Length: 1000\r\n\r\n", echoHost)
		require.NoError(t, err)
		go func() {
			for range 1000 {
				if _, err := conn.Write([]byte("x")); err != nil {
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		}()
		resp, answer := readResponse(t, conn)
		require.Equal(t, http.StatusRequestTimeout, resp.StatusCode, "%s", answer)
	})

	t.Run("a body that trickles in is cut at the body time limit and its connection closed", func(t *testing.T) {
		conn := dial(t, f.h.Info.EdgeAddr, "")
		_, err := fmt.Fprintf(conn, "POST /echo HTTP/1.1\r\nHost: %s\r\nContent-Length: 1000\r\n\r\n", echoHost)
		require.NoError(t, err)
		began := time.Now()
		go func() {
			for range 1000 {
				if _, err := conn.Write([]byte("x")); err != nil {
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		}()
		resp, body := readResponse(t, conn)
		took := time.Since(began)
		require.Equal(t, http.StatusRequestTimeout, resp.StatusCode, "%s", body)
		problem(t, body, adminapi.CodeBodyTimeout)
		require.InDelta(t, edgeLimits.BodyTimeout.Seconds(), took.Seconds(), 1, "cut at the limit")
		requireClosed(t, conn)
	})

	t.Run("headers that trickle in are cut at the header time limit", func(t *testing.T) {
		conn := dial(t, f.h.Info.EdgeAddr, "")
		_, err := fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: %s\r\n", echoHost)
		require.NoError(t, err)
		began := time.Now()
		requireClosed(t, conn)
		require.InDelta(t, edgeLimits.HeaderTimeout.Seconds(), time.Since(began).Seconds(), 1)
	})

	t.Run("an idle connection is closed at the idle time limit", func(t *testing.T) {
		conn := dial(t, f.h.Info.EdgeAddr, "")
		_, err := fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", echoHost)
		require.NoError(t, err)
		resp, _ := readResponse(t, conn)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		began := time.Now()
		requireClosed(t, conn)
		require.InDelta(t, edgeLimits.IdleTimeout.Seconds(), time.Since(began).Seconds(), 1)
	})

	t.Run("a request with both Content-Length and Transfer-Encoding is refused and its connection closed", func(t *testing.T) {
		for _, head := range []string{
			"POST /echo HTTP/1.1\r\nHost: %s\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
			"POST /echo HTTP/1.1\r\nHost: %s\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n0\r\n\r\n",
			// HTTP/1.0 has no Transfer-Encoding: its framing is faulty (RFC 9112 6.1).
			"POST /echo HTTP/1.0\r\nHost: %s\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\nhello",
		} {
			conn := dial(t, f.h.Info.EdgeAddr, "")
			// A smuggled second request follows; it must never be answered.
			_, err := fmt.Fprintf(conn, head+"GET /smuggled HTTP/1.1\r\nHost: %s\r\n\r\n", echoHost, echoHost)
			require.NoError(t, err)
			resp, body := readResponse(t, conn)
			require.Equal(t, http.StatusBadRequest, resp.StatusCode, "%q: %s", head, body)
			problem(t, body, adminapi.CodeBadFraming)
			requireClosed(t, conn)
		}
	})

	t.Run("pipelined requests with chunked and sized bodies are each read once and answered", func(t *testing.T) {
		conn := dial(t, f.h.Info.EdgeAddr, "")
		// Bodies that look like header blocks, to catch a framing check that reads them as such.
		fake := "GET /fake HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
		_, err := fmt.Fprintf(conn, "POST /a HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n3;ext=1\r\nabc\r\n0\r\nX-Trailer: 1\r\n\r\n"+
			"POST /b HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n%s"+
			"GET /c HTTP/1.1\r\nHost: %s\r\n\r\n",
			echoHost, len(fake), fake, echoHost, len(fake), fake, echoHost)
		require.NoError(t, err)
		for _, want := range []echoed{{Method: "POST", Path: "/a", Length: len(fake) + 3}, {Method: "POST", Path: "/b", Length: len(fake)}, {Method: "GET", Path: "/c"}} {
			resp, err := http.ReadResponse(conn.br, nil)
			require.NoError(t, err)
			b, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
			var e echoed
			require.NoError(t, json.Unmarshal(b, &e))
			require.Equal(t, want.Method+" "+want.Path+fmt.Sprint(want.Length), e.Method+" "+e.Path+fmt.Sprint(e.Length))
		}
	})

	t.Run("a client's Takoform headers never reach the worker", func(t *testing.T) {
		code, body, _ := get(t, echoHost, "/", http.Header{
			"Takoform-Probe-Socket": {"1"}, "Takoform-Probe": {"1"}, "takoform-egress-scheme": {"https"}, "X-Other": {"kept"},
		}, 5*time.Second, f.h.Info.EdgeAddr)
		require.Equal(t, http.StatusOK, code, "%s", body)
		var e echoed
		require.NoError(t, json.Unmarshal([]byte(body), &e), "the worker answered, not the probe: %s", body)
		require.Equal(t, "kept", e.Headers["x-other"])
		for k := range e.Headers {
			require.False(t, strings.HasPrefix(k, "takoform-"), "%s reached the worker", k)
		}
	})

	forged := http.Header{
		"X-Forwarded-For": {"203.0.113.7"}, "X-Forwarded-Proto": {"https"}, "X-Real-Ip": {"198.51.100.9"},
		"Forwarded": {"for=203.0.113.7;proto=https"}, "X-Forwarded-Host": {"bank.example"},
	}
	t.Run("forwarding headers from a client that is no trusted proxy are replaced", func(t *testing.T) {
		code, body, _ := get(t, echoHost, "/", forged, 5*time.Second, f.h.Info.EdgeAddr)
		require.Equal(t, http.StatusOK, code, "%s", body)
		var e echoed
		require.NoError(t, json.Unmarshal([]byte(body), &e))
		require.Equal(t, "127.0.0.1", e.Headers["x-forwarded-for"])
		require.Equal(t, "http:", e.Scheme, "the client's X-Forwarded-Proto is replaced")
		require.Equal(t, "127.0.0.1", e.Headers["x-real-ip"])
		require.Equal(t, "for=127.0.0.1;proto=http", e.Headers["forwarded"])
		require.Equal(t, echoHost, e.Headers["x-forwarded-host"])
	})

	t.Run("forwarding headers from a trusted proxy are kept and appended to", func(t *testing.T) {
		// 127.0.0.2 is in --trusted-proxy; the edge listens on 127.0.0.1, which it reaches.
		code, body, _ := get(t, echoHost, "/", forged, 5*time.Second, f.h.Info.EdgeAddr, "127.0.0.2")
		require.Equal(t, http.StatusOK, code, "%s", body)
		var e echoed
		require.NoError(t, json.Unmarshal([]byte(body), &e))
		require.Equal(t, "203.0.113.7, 127.0.0.2", e.Headers["x-forwarded-for"])
		require.Equal(t, "https:", e.Scheme, "a trusted proxy's X-Forwarded-Proto is kept")
		require.Equal(t, "203.0.113.7", e.Headers["x-real-ip"])
		require.Equal(t, "for=203.0.113.7;proto=https, for=127.0.0.2;proto=http", e.Headers["forwarded"])
		require.Equal(t, "bank.example", e.Headers["x-forwarded-host"])
	})

	t.Run("a WebSocket passes through, past the response time limit", func(t *testing.T) {
		conn := dial(t, f.h.Info.EdgeAddr, "")
		_, err := fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
			"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", echoHost)
		require.NoError(t, err)
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
		resp, err := http.ReadResponse(conn.br, nil)
		require.NoError(t, err)
		require.Equal(t, http.StatusSwitchingProtocols, resp.StatusCode)
		require.Equal(t, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=", resp.Header.Get("Sec-WebSocket-Accept"), "RFC 6455 1.3's example")
		for i := range 2 {
			if i == 1 {
				time.Sleep(edgeLimits.ResponseTimeout + 500*time.Millisecond)
			}
			msg := fmt.Sprintf("hello %d", i)
			// One masked text frame (RFC 6455 5.2), mask 0.
			_, err = conn.Write(append([]byte{0x81, 0x80 | byte(len(msg)), 0, 0, 0, 0}, msg...))
			require.NoError(t, err)
			head := make([]byte, 2)
			_, err = io.ReadFull(conn.br, head)
			require.NoError(t, err)
			got := make([]byte, head[1]&0x7f)
			_, err = io.ReadFull(conn.br, got)
			require.NoError(t, err)
			require.Equal(t, "echo:"+msg, string(got))
		}
	})

	t.Run("unknown hosts get a 404 problem with nothing internal", func(t *testing.T) {
		code, body, _ := get(t, "nobody.workers.localhost", "/", nil, 5*time.Second, f.h.Info.EdgeAddr)
		require.Equal(t, http.StatusNotFound, code)
		problem(t, body, adminapi.CodeUnknownHost)
	})
}

// rawConn is a client connection written by hand, read through one buffer.
type rawConn struct {
	net.Conn
	br *bufio.Reader
}

func dial(t *testing.T, addr, local string) *rawConn {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second}
	if local != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(local)}
	}
	conn, err := d.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return &rawConn{Conn: conn, br: bufio.NewReader(conn)}
}

// get sends one GET through the edge at addr (from the local address, when given).
func get(t *testing.T, host, path string, header http.Header, timeout time.Duration, addr string, local ...string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
	require.NoError(t, err)
	req.Host = host
	for k, v := range header {
		req.Header[k] = v
	}
	tr := &http.Transport{}
	if len(local) > 0 {
		tr.DialContext = (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local[0])}}).DialContext
	}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: timeout}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b), resp.Header
}

// post sends body to the echo worker.
func post(t *testing.T, addr string, body io.Reader) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/echo", body)
	require.NoError(t, err)
	req.Host = echoHost
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

func readResponse(t *testing.T, conn *rawConn) (*http.Response, string) {
	t.Helper()
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	resp, err := http.ReadResponse(conn.br, nil)
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b)
}

// requireClosed waits for the edge to close conn (nothing more is answered on it).
func requireClosed(t *testing.T, conn *rawConn) {
	t.Helper()
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))
	b, err := io.ReadAll(conn.br)
	if errors.Is(err, syscall.ECONNRESET) {
		err = nil
	}
	require.NoError(t, err, "the edge kept the connection open")
	require.Empty(t, string(b), "the edge answered more on a connection it should have closed")
}

// The edge keeps connections to a worker's socket between requests. When the worker's process
// dies and continuity restarts it on the same socket, the edge's idle connections to the dead
// process are noticed and replaced, never used: no request fails once the worker is Ready again.
func TestEdgeNeverUsesAConnectionToADeadProcess(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.putSource("echo", "uid-echo", echoSource)
	f.route(echoHost, "echo", "ep-echo")
	before := f.waitReady("echo")
	// Several connections in the edge's pool.
	burst := func() []int {
		codes := make(chan int, 8)
		for range 8 {
			go func() {
				code, _, _ := get(t, echoHost, "/", nil, 10*time.Second, f.h.Info.EdgeAddr)
				codes <- code
			}()
		}
		var all []int
		for range 8 {
			all = append(all, <-codes)
		}
		return all
	}
	require.Equal(t, []int{200, 200, 200, 200, 200, 200, 200, 200}, burst())
	f.kill("echo")
	f.waitStatus("restarted and Ready", func(s adminapi.ScriptStatus) bool {
		return s.Ready && s.Incarnation.PID != before.Incarnation.PID
	}, "echo")
	require.Equal(t, []int{200, 200, 200, 200, 200, 200, 200, 200}, burst(), "a request went to a dead process's connection")
}
