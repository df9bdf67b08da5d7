package orgproc

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd"
	"github.com/takoform/terraform-provider-takoform/internal/safedir"
)

// sandboxSocketDir is where a sandboxed process sees its socket directory.
const sandboxSocketDir = "/sockets"

// sockets are one process's channels to the runtime (SPEC 5: path Unix sockets only, nothing on
// a network; the process has none). Under the Manager's ChannelsDir (0711, the node's):
//
//	<name>/          0700, the organization's uid: bound into its sandbox alone, at /sockets
//	  code.sock      the runtime serves the code of the incarnations placed in the process
//	  egress.sock    its isolates' fetch()
//	  bindings.sock  their service binding calls
//	  tails.sock     their logs
//
// and under its SocketsDir (0700, the node's, in its state directory):
//
//	<name>.ingress   0600: the edge's and probes' way in (workerd gets the listening
//	                 descriptor; no path to it is in the sandbox)
//	<name>.conf/     0700: the config and router, copied into the sandbox
//
// Each socket the runtime serves checks its peer's credentials: only the organization's uid (the
// node's own without a sandbox) is answered.
type sockets struct {
	// dir is the socket directory's path on the host; dirFD holds it open for the sandbox's
	// bind; confDir holds the config.
	dir     string
	dirFD   *os.File
	confDir string
	// ingress is the listening socket workerd serves; ingressDial the path the node dials it at
	// (through the Manager's descriptor of SocketsDir), dialAddr the same as the edge takes it,
	// and ingressPath its path on the host.
	ingress     *net.UnixListener
	ingressDial string
	dialAddr    string
	ingressPath string
	servers     []*http.Server
	refused     atomic.Int64
}

// fdPath is name under dir (one of the Manager's directories) through its descriptor: short
// whatever the directory's own path is (a Unix socket's path is at most 107 bytes).
func fdPath(dir *os.File, name string) string {
	return "/proc/self/fd/" + strconv.Itoa(int(dir.Fd())) + "/" + name
}

// openSockets makes the process's socket directory, listens on its sockets and writes its config.
func (p *Process) openSockets() (err error) {
	m, s := p.m, &p.sock
	owner := safedir.Current()
	s.dir = filepath.Join(m.opts.ChannelsDir, p.name)
	s.confDir = filepath.Join(m.opts.SocketsDir, p.name+".conf")
	s.ingressPath = filepath.Join(m.opts.SocketsDir, p.name+".ingress")
	s.ingressDial = fdPath(m.socketsDir, p.name+".ingress")
	s.dialAddr = "unix:" + s.ingressDial
	defer func() {
		if err != nil {
			s.close(p)
		}
	}()
	if err := safedir.Ensure(s.confDir, owner); err != nil {
		return err
	}
	for name, data := range p.files {
		if err := safedir.WriteFile(s.confDir, name, data, owner); err != nil {
			return err
		}
	}
	if err := safedir.Ensure(s.dir, owner); err != nil {
		return err
	}
	if s.ingress, err = listenUnix(s.ingressDial); err != nil {
		return err
	}
	channels := []struct {
		name    string
		handler http.Handler
	}{
		{workerd.CodeSocket, http.HandlerFunc(p.serveCode)},
		{workerd.EgressSocket, http.HandlerFunc(p.serveEgress)},
		{workerd.BindSocket, http.HandlerFunc(p.serveBinding)},
		{workerd.TailSocket, http.HandlerFunc(p.serveTail)},
	}
	peer := os.Getuid()
	if m.opts.Sandbox != nil {
		peer = p.uid
	}
	for _, c := range channels {
		path := fdPath(m.channelsDir, p.name+"/"+c.name)
		l, err := listenUnix(path)
		if err != nil {
			return err
		}
		if m.opts.Sandbox != nil {
			if err := os.Lchown(path, p.uid, p.uid); err != nil {
				l.Close()
				return fmt.Errorf("hand socket %s to uid %d: %w", c.name, p.uid, err)
			}
		}
		srv := &http.Server{Handler: c.handler, ReadHeaderTimeout: 10 * time.Second,
			ErrorLog: slog.NewLogLogger(p.log.Handler(), slog.LevelWarn)}
		s.servers = append(s.servers, srv)
		go func() { _ = srv.Serve(&peerListener{UnixListener: l, uid: peer, refused: &s.refused, log: p}) }()
	}
	if m.opts.Sandbox != nil {
		// Last: the directory is the organization's once everything in it is ready.
		if err := os.Lchown(fdPath(m.channelsDir, p.name), p.uid, p.uid); err != nil {
			return fmt.Errorf("hand the socket directory to uid %d: %w", p.uid, err)
		}
	}
	if s.dirFD, err = os.OpenFile(fdPath(m.channelsDir, p.name), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
		return fmt.Errorf("open the socket directory: %w", err)
	}
	return nil
}

// listenUnix listens on a Unix socket at path that only the node's user may connect to until it
// is handed on.
func listenUnix(path string) (*net.UnixListener, error) {
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen on a process socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, err
	}
	// The directory goes whole when the process stops; a listener unlinking its own path through
	// /proc/self/fd/N would need that descriptor still open.
	l.SetUnlinkOnClose(false)
	return l, nil
}

// close stops serving the process's sockets and removes its directories.
func (s *sockets) close(p *Process) {
	for _, srv := range s.servers {
		_ = srv.Close()
	}
	if s.ingress != nil {
		_ = s.ingress.Close()
	}
	if s.dirFD != nil {
		_ = s.dirFD.Close()
	}
	for _, dir := range []string{s.dir, s.confDir} {
		if dir == "" {
			continue
		}
		// A directory handed to the organization's uid comes back to the node before it goes.
		_ = os.Lchown(dir, os.Getuid(), os.Getgid())
		if err := os.RemoveAll(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			p.log.Error("remove a process's directory", "error", err)
		}
	}
	if s.ingressPath != "" {
		_ = os.Remove(s.ingressPath)
	}
}

// clearSockets removes what an earlier run left in the sockets directory (it was killed): every
// process starts afresh.
func clearSockets(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		_ = os.Lchown(path, os.Getuid(), os.Getgid())
		if err := os.RemoveAll(path); err != nil {
			return fmt.Errorf("remove what an earlier run left in %s: %w", dir, err)
		}
	}
	return nil
}

// peerListener answers only connections whose peer runs as uid (SO_PEERCRED): another
// organization's uid, or anyone else who reaches the socket, is closed on at once.
type peerListener struct {
	*net.UnixListener
	uid     int
	refused *atomic.Int64
	log     *Process
}

func (l *peerListener) Accept() (net.Conn, error) {
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			return nil, err
		}
		uid, err := peerUID(c)
		if err == nil && uid == l.uid {
			return c, nil
		}
		if l.refused.Add(1) == 1 {
			l.log.log.Warn("refused a connection to an organization process's socket", "peerUid", uid, "want", l.uid, "error", err)
		}
		c.Close()
	}
}

// peerUID is the uid of the process at the other end of c.
func peerUID(c *net.UnixConn) (int, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return -1, err
	}
	var cred *syscall.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return -1, err
	}
	if credErr != nil {
		return -1, credErr
	}
	return int(cred.Uid), nil
}
