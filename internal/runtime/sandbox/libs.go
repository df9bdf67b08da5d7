package sandbox

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"os/exec"
	"strings"
)

// sharedLibraries lists the files the dynamic loader maps for binary: its interpreter and every
// library the interpreter resolves for it. The interpreter's --list mode (what ldd runs) resolves
// without running any of the binary's code. A static binary needs none.
func sharedLibraries(binary string) ([]string, error) {
	f, err := elf.Open(binary)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", binary, err)
	}
	defer f.Close()
	var interp string
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		b, err := io.ReadAll(p.Open())
		if err != nil {
			return nil, fmt.Errorf("read the interpreter of %s: %w", binary, err)
		}
		interp = strings.TrimRight(string(b), "\x00")
	}
	if interp == "" {
		return nil, nil
	}
	cmd := exec.Command(interp, "--list", binary)
	cmd.Env = []string{} // no LD_LIBRARY_PATH or LD_PRELOAD of the node's own environment
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("list the shared libraries of %s with %s: %w", binary, interp, err)
	}
	return parseLoaderList(out, interp)
}

// parseLoaderList reads the interpreter's --list output ("libc.so.6 => /lib/…/libc.so.6 (0x…)",
// "/lib64/ld-linux-x86-64.so.2 (0x…)", "linux-vdso.so.1 (0x…)").
func parseLoaderList(out []byte, interp string) ([]string, error) {
	seen := map[string]bool{interp: true}
	libs := []string{interp}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		if name, target, ok := strings.Cut(line, "=>"); ok {
			target = strings.TrimSpace(target)
			if strings.HasPrefix(target, "not found") {
				return nil, fmt.Errorf("shared library %s is not found", strings.TrimSpace(name))
			}
			line = target
		}
		path, _, _ := strings.Cut(line, " (")
		path = strings.TrimSpace(path)
		if !strings.HasPrefix(path, "/") || seen[path] {
			continue // the vDSO has no file
		}
		seen[path] = true
		libs = append(libs, path)
	}
	return libs, nil
}
