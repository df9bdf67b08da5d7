package edge

import (
	"bytes"
	"strconv"
	"sync"
)

// framing follows the HTTP/1.x byte stream of one connection as the server reads it, header block
// by header block, and notes for each request whether its framing is one RFC 9112 6.1 makes a
// server close the connection for: both Content-Length and Transfer-Encoding, or
// Transfer-Encoding on HTTP/1.0. It skips bodies the way net/http reads them (Content-Length
// bytes, or chunks), so that every header block it reads is one the server reads too; the handler
// takes the notes in order, one per request (net/http serves one request of a connection at a
// time, in order). Where it cannot follow the stream (a malformed chunk), it stops, and every
// later request of the connection is refused: the server would have refused it anyway.
type framing struct {
	mu    sync.Mutex
	state int
	line  []byte // the current line, kept up to maxLine bytes
	long  bool   // the current line went past maxLine

	// the header block being read
	inFields   bool // its request line has been read
	http10     bool
	hasLength  bool
	hasEncode  bool
	length     int64
	lengthBad  bool
	remaining  int64  // body bytes left to skip (a Content-Length body, or a chunk's data)
	notes      []bool // per header block read and not yet taken: true = refuse and close
	notesStart int
}

const (
	stHeaders = iota
	stBody
	stChunkSize
	stChunkData
	stChunkEnd
	stTrailers
	stLost // the stream is no longer followed
)

// maxLine is the longest line kept whole: header lines that matter here are short; a longer one
// is only skipped.
const maxLine = 256

// scan follows b, the next bytes the server read from the connection.
func (f *framing) scan(b []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for len(b) > 0 {
		switch f.state {
		case stLost:
			return
		case stBody, stChunkData:
			n := int64(len(b))
			if n > f.remaining {
				n = f.remaining
			}
			f.remaining -= n
			b = b[n:]
			if f.remaining == 0 {
				if f.state == stBody {
					f.startBlock()
				} else {
					f.state = stChunkEnd
				}
			}
		default:
			i := bytes.IndexByte(b, '\n')
			if i < 0 {
				f.keep(b)
				return
			}
			f.keep(b[:i])
			b = b[i+1:]
			line := bytes.TrimSuffix(f.line, []byte{'\r'})
			f.endLine(line)
			f.line, f.long = f.line[:0], false
		}
	}
}

func (f *framing) keep(b []byte) {
	if room := maxLine - len(f.line); room > 0 {
		if len(b) > room {
			b, f.long = b[:room], true
		}
		f.line = append(f.line, b...)
	} else if len(b) > 0 {
		f.long = true
	}
}

func (f *framing) startBlock() {
	f.state, f.inFields = stHeaders, false
	f.http10, f.hasLength, f.hasEncode, f.length, f.lengthBad = false, false, false, 0, false
}

func (f *framing) endLine(line []byte) {
	switch f.state {
	case stHeaders:
		f.headerLine(line)
	case stChunkSize:
		if f.long {
			f.state = stLost
			return
		}
		if i := bytes.IndexByte(line, ';'); i >= 0 {
			line = line[:i]
		}
		n, err := strconv.ParseUint(string(bytes.TrimRight(line, " \t")), 16, 63)
		if err != nil {
			f.state = stLost
			return
		}
		if n == 0 {
			f.state = stTrailers
			return
		}
		f.state, f.remaining = stChunkData, int64(n)
	case stChunkEnd:
		if len(line) != 0 {
			f.state = stLost
			return
		}
		f.state = stChunkSize
	case stTrailers:
		if len(line) == 0 {
			f.startBlock()
		}
	}
}

func (f *framing) headerLine(line []byte) {
	if !f.inFields {
		f.inFields = true
		f.http10 = bytes.HasSuffix(line, []byte(" HTTP/1.0"))
		return
	}
	if len(line) == 0 {
		if !f.long {
			f.endBlock()
		}
		return
	}
	if line[0] == ' ' || line[0] == '\t' {
		return // a continuation of the previous field's value
	}
	colon := bytes.IndexByte(line, ':')
	if colon < 0 {
		return
	}
	name, value := line[:colon], bytes.Trim(line[colon+1:], " \t")
	switch {
	case bytes.EqualFold(name, []byte("Content-Length")):
		n, err := strconv.ParseInt(string(value), 10, 64)
		if f.long || err != nil || n < 0 || (f.hasLength && n != f.length) {
			f.lengthBad = true
		}
		f.hasLength, f.length = true, n
	case bytes.EqualFold(name, []byte("Transfer-Encoding")):
		f.hasEncode = true
	}
}

// endBlock notes the header block just read and follows its body.
func (f *framing) endBlock() {
	refuse := f.hasEncode && (f.hasLength || f.http10)
	f.notes = append(f.notes, refuse)
	switch {
	case refuse:
		// The connection closes after this request; nothing later is read.
		f.state = stLost
	case f.hasEncode:
		f.state = stChunkSize
	case f.hasLength && !f.lengthBad && f.length > 0:
		f.state, f.remaining = stBody, f.length
	case f.lengthBad:
		f.state = stLost // the server refuses it too
	default:
		f.startBlock()
	}
}

// next takes the note of the next request the server hands the edge: true when it must be
// refused and its connection closed.
func (f *framing) next() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.notesStart == len(f.notes) {
		// Not followed this far (the stream was lost before its header block).
		return true
	}
	refuse := f.notes[f.notesStart]
	f.notesStart++
	if f.notesStart == len(f.notes) {
		f.notes, f.notesStart = f.notes[:0], 0
	}
	return refuse
}

// stop ends the following (the connection was taken over, for example by a WebSocket).
func (f *framing) stop() {
	f.mu.Lock()
	f.state = stLost
	f.mu.Unlock()
}
