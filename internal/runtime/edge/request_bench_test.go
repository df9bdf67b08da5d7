package edge_test

import (
	"bufio"
	"bytes"
	"net"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/edge"
)

var fixedAnswer = []byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\r\nok\n")

// BenchmarkOneRequestThroughTheEdge carries kept-alive GETs through the edge's own HTTP/1.1 loop to
// an upstream that answers each at once, all in this process: its allocations per request are the
// edge's (the client and the upstream allocate nothing per request), and its time is the three of
// them together. make bench-edge measures the edge's CPU against nginx on a real node; this is
// the quick loop for the edge's own per-request work.
func BenchmarkOneRequestThroughTheEdge(b *testing.B) {
	up, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	b.Cleanup(func() { up.Close() })
	go func() {
		for {
			c, err := up.Accept()
			if err != nil {
				return
			}
			go answerEach(c)
		}
	}()
	srv := edge.NewH1Server(edge.New(stubResolver{"w.test": deadTarget{up.Addr().String()}}, nil, nil, edge.Limits{}), edge.Limits{}, nil)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	go func() { _ = srv.Serve(l) }()
	b.Cleanup(func() { srv.Close() })

	c, err := net.Dial("tcp", l.Addr().String())
	require.NoError(b, err)
	defer c.Close()
	req := []byte("GET /path?q=1 HTTP/1.1\r\nHost: w.test\r\nUser-Agent: bench\r\nAccept: */*\r\n\r\n")
	br := bufio.NewReaderSize(c, 4<<10)
	buf := make([]byte, 4<<10)
	one := func() {
		if _, err := c.Write(req); err != nil {
			b.Fatal(err)
		}
		n := 0
		for {
			m, err := br.Read(buf[n:])
			if err != nil {
				b.Fatal(err)
			}
			n += m
			if i := bytes.Index(buf[:n], []byte("\r\n\r\n")); i >= 0 && bytes.HasSuffix(buf[:n], []byte("ok\n")) {
				return
			}
		}
	}
	one()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		one()
	}
}

// answerEach answers every request on c with fixedAnswer, allocating nothing per request.
func answerEach(c net.Conn) {
	defer c.Close()
	br := bufio.NewReaderSize(c, 4<<10)
	for {
		for {
			line, err := br.ReadSlice('\n')
			if err != nil {
				return
			}
			if len(line) <= 2 {
				break
			}
		}
		if _, err := c.Write(fixedAnswer); err != nil {
			return
		}
	}
}

var _ http.Handler = (*edge.Handler)(nil)
