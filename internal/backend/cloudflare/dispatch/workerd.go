package dispatch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Workerd is the dispatch worker running in workerd behind the shim (tests and the Cloudflare
// stand-in): requests to Addr are what the base-domain route sends to the dispatch worker.
type Workerd struct {
	addr        string
	bindingAddr string
	cmd         *exec.Cmd
	dir         string
	done        chan struct{}
	output      *limitedBuffer
	once        sync.Once
}

// StartWorkerd runs the dispatch worker in the workerd binary at path, its ROUTES binding served
// by the KV service at kvAddr and its DISPATCHER by the namespace service at namespaceAddr (see
// WorkerdConfig), and waits until it serves.
func StartWorkerd(path, kvAddr, namespaceAddr string, cacheTTL int) (*Workerd, error) {
	return StartWorkerdWithBinding(path, kvAddr, namespaceAddr, cacheTTL, nil)
}

// StartWorkerdWithBinding is StartWorkerd with, when props is set, a socket that serves the
// Binding entrypoint with props (BindingAddr), as a caller's service binding reaches it.
func StartWorkerdWithBinding(path, kvAddr, namespaceAddr string, cacheTTL int, props *BindingProps) (*Workerd, error) {
	dir, err := os.MkdirTemp("", "takoform-dispatch-")
	if err != nil {
		return nil, err
	}
	for name, data := range WorkerdConfig(kvAddr, namespaceAddr, cacheTTL, props) {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
	}
	var lc net.ListenConfig
	var files []*os.File
	var addrs []string
	sockets := 2
	if props != nil {
		sockets = 3
	}
	for range sockets {
		ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		f, err := ln.(*net.TCPListener).File()
		addrs = append(addrs, ln.Addr().String())
		_ = ln.Close()
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		defer f.Close()
		files = append(files, f)
	}
	out := &limitedBuffer{limit: 16 << 10}
	args := []string{"serve", "config.capnp", "config", "--socket-fd", "http=3", "--socket-fd", "ready=4"}
	if props != nil {
		args = append(args, "--socket-fd", "binding=5")
	}
	cmd := exec.Command(path, args...)
	cmd.Dir, cmd.Env, cmd.ExtraFiles = dir, []string{}, files
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("dispatch: start workerd: %w", err)
	}
	w := &Workerd{addr: addrs[0], cmd: cmd, dir: dir, done: make(chan struct{}), output: out}
	if props != nil {
		w.bindingAddr = addrs[2]
	}
	go func() { _ = cmd.Wait(); close(w.done) }()
	client := &http.Client{Timeout: time.Second}
	for deadline := time.Now().Add(20 * time.Second); ; {
		select {
		case <-w.done:
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("dispatch: workerd exited: %s", strings.TrimSpace(out.String()))
		default:
		}
		if res, err := client.Get("http://" + addrs[1] + "/"); err == nil {
			_, _ = io.Copy(io.Discard, res.Body)
			_ = res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return w, nil
			}
		}
		if time.Now().After(deadline) {
			w.Close()
			return nil, errors.New("dispatch: workerd did not serve within 20 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Addr is the dispatch worker's plain-HTTP address; the request's Host names the hostname.
func (w *Workerd) Addr() string { return w.addr }

// BindingAddr is the plain-HTTP address of the Binding entrypoint socket ("" without props).
func (w *Workerd) BindingAddr() string { return w.bindingAddr }

// Output is what workerd wrote (its first 16 KiB).
func (w *Workerd) Output() string { return w.output.String() }

// Close stops workerd and removes its files.
func (w *Workerd) Close() {
	w.once.Do(func() {
		if w.cmd.Process != nil {
			_ = syscall.Kill(-w.cmd.Process.Pid, syscall.SIGKILL)
		}
		<-w.done
		_ = os.RemoveAll(w.dir)
	})
}

type limitedBuffer struct {
	mu    sync.Mutex
	buf   []byte
	limit int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.limit - len(b.buf); room > 0 {
		b.buf = append(b.buf, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (b *limitedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}
