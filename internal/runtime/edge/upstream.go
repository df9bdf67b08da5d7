package edge

import (
	"bufio"
	"errors"
	"io"
	"math"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// upstreams keeps, per incarnation socket, the idle HTTP/1.1 connections the edge reuses. The
// edge speaks to workerd on its own instead of through http.Transport: a request is written and
// its answer read on the handler's goroutine, with no hand-off to a connection's read and write
// goroutines (most of what the transport costs per request on a small machine), and never
// replayed on another connection (see forward).
type upstreams struct {
	pools     sync.Map // address → *pool
	dialer    net.Dialer
	requests  atomic.Uint64
	lastSweep atomic.Int64
}

// Idle connections: how many one socket keeps, and for how long. workerd closes a kept-alive
// connection that brings no next request within 15 s (measured with the pinned workerd): one kept
// near that long could be closed under the request just sent on it, which the edge never replays.
const (
	maxIdlePerTarget = 256
	idleConnTimeout  = 10 * time.Second
	sweepEvery       = 4096 // requests between two looks for idle connections to close
	dialTimeout      = 5 * time.Second
)

type pool struct {
	mu   sync.Mutex
	idle []*upConn // most recently used last
}

// upConn is one connection to a process's socket.
type upConn struct {
	conn   halfCloser
	raw    syscall.RawConn
	lim    budgetReader // under br: bounds what one answer's headers may take
	br     *bufio.Reader
	bw     *bufio.Writer
	pool   *pool
	idleAt time.Time
}

// halfCloser is a connection to a process's socket: TCP, or a Unix socket.
type halfCloser interface {
	net.Conn
	CloseWrite() error
	SyscallConn() (syscall.RawConn, error)
}

// get returns an idle connection to addr that is still open, or a new one.
func (u *upstreams) get(addr string, deadline time.Time) (*upConn, error) {
	p := u.pool(addr)
	for {
		p.mu.Lock()
		n := len(p.idle)
		if n == 0 {
			p.mu.Unlock()
			break
		}
		c := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		if time.Since(c.idleAt) < idleConnTimeout && c.open() {
			return c, nil
		}
		c.conn.Close()
	}
	d := u.dialer
	d.Deadline, d.Timeout = deadline, dialTimeout
	network, address := "tcp", addr
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		network, address = "unix", path
	}
	nc, err := d.Dial(network, address)
	if err != nil {
		return nil, err
	}
	tc := nc.(halfCloser)
	raw, err := tc.SyscallConn()
	if err != nil {
		tc.Close()
		return nil, err
	}
	c := &upConn{conn: tc, raw: raw, bw: bufio.NewWriterSize(tc, 8<<10), pool: p}
	c.lim = budgetReader{r: tc, n: math.MaxInt64}
	c.br = bufio.NewReaderSize(&c.lim, 8<<10)
	return c, nil
}

// maxAnswerHeaderBytes bounds the status line and headers of a worker's answer (informational
// ones included): a worker cannot make the edge hold more than this in memory for one request.
// http.Transport's default is 10 MiB; browsers and CDNs refuse far less.
const maxAnswerHeaderBytes = 1 << 20

// budgetReader reads at most n bytes (then fails) while a worker's answer head is read.
type budgetReader struct {
	r io.Reader
	n int64
}

var errAnswerHeaderTooLarge = errors.New("the worker's answer headers are too large")

func (b *budgetReader) Read(p []byte) (int, error) {
	if b.n <= 0 {
		return 0, errAnswerHeaderTooLarge
	}
	if int64(len(p)) > b.n {
		p = p[:b.n]
	}
	n, err := b.r.Read(p)
	b.n -= int64(n)
	return n, err
}

func (u *upstreams) pool(addr string) *pool {
	if p, ok := u.pools.Load(addr); ok {
		return p.(*pool)
	}
	p, _ := u.pools.LoadOrStore(addr, &pool{})
	return p.(*pool)
}

// put keeps c for the next request to its socket.
func (u *upstreams) put(c *upConn) {
	if err := c.conn.SetDeadline(time.Time{}); err != nil {
		c.conn.Close()
		return
	}
	c.idleAt = time.Now()
	p := c.pool
	p.mu.Lock()
	if len(p.idle) >= maxIdlePerTarget {
		p.mu.Unlock()
		c.conn.Close()
	} else {
		p.idle = append(p.idle, c)
		p.mu.Unlock()
	}
	if u.requests.Add(1)%sweepEvery == 0 {
		u.sweep(c.idleAt)
	}
}

// sweep closes connections idle for longer than idleConnTimeout (those to incarnations that
// stopped among them) and forgets sockets with none left.
func (u *upstreams) sweep(now time.Time) {
	last := u.lastSweep.Load()
	if now.UnixNano()-last < int64(idleConnTimeout/2) || !u.lastSweep.CompareAndSwap(last, now.UnixNano()) {
		return
	}
	u.pools.Range(func(addr, v any) bool {
		p := v.(*pool)
		p.mu.Lock()
		keep := p.idle[:0]
		for _, c := range p.idle {
			if now.Sub(c.idleAt) > idleConnTimeout {
				c.conn.Close()
			} else {
				keep = append(keep, c)
			}
		}
		clear(p.idle[len(keep):])
		p.idle = keep
		empty := len(keep) == 0
		p.mu.Unlock()
		if empty {
			u.pools.CompareAndDelete(addr, p)
		}
		return true
	})
}

// closeIdle closes every idle connection.
func (u *upstreams) closeIdle() {
	u.pools.Range(func(addr, v any) bool {
		p := v.(*pool)
		p.mu.Lock()
		for _, c := range p.idle {
			c.conn.Close()
		}
		p.idle = nil
		p.mu.Unlock()
		u.pools.Delete(addr)
		return true
	})
}

// open reports whether an idle connection is still usable: the peer has neither closed it (its
// process restarted, or it timed the connection out) nor sent anything unasked. One non-blocking
// peek; http.Transport learns the same from the read it keeps pending on every idle connection.
func (c *upConn) open() bool {
	if c.br.Buffered() > 0 {
		return false
	}
	alive := false
	err := c.raw.Read(func(fd uintptr) bool {
		var b [1]byte
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		alive = err == syscall.EAGAIN
		return true
	})
	return err == nil && alive
}
