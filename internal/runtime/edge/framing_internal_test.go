package edge

import (
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The framing check reads a connection's bytes as the server happens to receive them: whatever
// the split into reads, it notes the same verdict for each request, in order.
func TestFramingNotesEachRequestWhateverTheReadsSplit(t *testing.T) {
	t.Parallel()
	fake := "GET /fake HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
	stream := "GET / HTTP/1.1\r\nHost: a\r\n\r\n" +
		"POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nX-Long: " + strings.Repeat("x", 1000) + "\r\n\r\n" +
		"1a\r\n" + fake[:26] + "\r\n" + "3;ext=1\r\nabc\r\n0\r\nX-Trailer: 1\r\n\r\n" +
		"POST /b HTTP/1.1\r\nHost: a\r\ncontent-length: " + strconv.Itoa(len(fake)) + "\r\n\r\n" + fake +
		"PUT /c HTTP/1.1\r\nHost: a\r\nX-Folded: a\r\n Content-Length: 7\r\n\r\n" + // a continuation line, not a field
		"GET /d HTTP/1.1\nHost: a\nContent-Length: 0\n\n" + // bare LF, as net/http accepts
		"POST /e HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n"
	want := []bool{false, false, false, false, false, true}

	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	for round := range 200 {
		var f framing
		rest := stream
		for rest != "" {
			n := 1
			if round > 0 {
				n = 1 + rng.IntN(64)
			}
			n = min(n, len(rest))
			f.scan([]byte(rest[:n]))
			rest = rest[n:]
		}
		for i, w := range want {
			if got := f.next(); got != w {
				t.Fatalf("seed %d round %d: request %d noted refuse=%v, want %v", seed, round, i, got, w)
			}
		}
		if !f.next() {
			t.Fatalf("seed %d round %d: a request the stream does not hold was let through", seed, round)
		}
	}
}
