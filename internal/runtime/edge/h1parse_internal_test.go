package edge

import (
	"bufio"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
)

// chunks builds a chunked body of n one-byte chunks, each size line with ext bytes of extension.
func chunks(n, ext int) string {
	var b strings.Builder
	for range n {
		b.WriteString("1")
		if ext > 0 {
			b.WriteString(";" + strings.Repeat("e", ext-1))
		}
		b.WriteString("\r\nx\r\n")
	}
	b.WriteString("0\r\n\r\n")
	return b.String()
}

// A chunked body's overhead is bounded as net/http bounds it (CVE-2023-39326): one-byte chunks
// streamed one at a time are read, but one-byte chunks each with a 4000-byte extension are
// refused early, where a fresh line budget per chunk would have read them all; net/http refuses
// them too.
func TestChunkedBodyBoundsItsOverhead(t *testing.T) {
	t.Parallel()
	read := func(body string) (int, error) {
		c := &chunkedBody{br: bufio.NewReaderSize(strings.NewReader(body), 4096), budget: 8 << 10}
		b, err := io.ReadAll(c)
		return len(b), err
	}
	std := func(body string) error {
		req, err := http.ReadRequest(bufio.NewReader(strings.NewReader("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n" + body)))
		if err != nil {
			t.Fatal(err)
		}
		_, err = io.ReadAll(req.Body)
		return err
	}
	for _, fair := range []string{chunks(1000, 0), chunks(1000, 10), "1000;" + strings.Repeat("e", 4000) + "\r\n" + strings.Repeat("d", 4096) + "\r\n0\r\n\r\n"} {
		if _, err := read(fair); err != nil {
			t.Fatalf("a fair body was refused: %v", err)
		}
		if err := std(fair); err != nil {
			t.Fatalf("net/http refuses a body the test calls fair: %v", err)
		}
	}
	heavy := chunks(1000, 4000)
	n, err := read(heavy)
	if !errors.Is(err, errChunkOverhead) {
		t.Fatalf("1000 one-byte chunks with 4000-byte extensions: read %d bytes, error %v", n, err)
	}
	if n > 10 {
		t.Fatalf("%d bytes were read before the overhead was noticed", n)
	}
	if std(heavy) == nil {
		t.Fatal("net/http reads the heavy body: the test does not match its limit")
	}
}
