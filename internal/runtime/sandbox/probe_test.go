package sandbox

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"
)

// The test binary doubles as the probe program run inside the sandbox: TestMain runs a probe
// instead of the tests when probeEnv names one.
const probeEnv = "TAKOFORM_SANDBOX_PROBE"

func TestMain(m *testing.M) {
	if mode := os.Getenv(probeEnv); mode != "" {
		os.Exit(runProbe(mode, os.Args[1:]))
	}
	os.Exit(m.Run())
}

// probeReport is what the report probe prints.
type probeReport struct {
	UID, GID int
	// Paths maps each path asked about to "" when it exists, else the error.
	Paths map[string]string
	// Pids are the processes visible in /proc.
	Pids []int
	// Read is the content of the first argument, a file the sandbox was given.
	Read string
}

func runProbe(mode string, args []string) int {
	switch mode {
	case "report":
		r := probeReport{UID: os.Getuid(), GID: os.Getgid(), Paths: map[string]string{}}
		for _, p := range args[1:] {
			if _, err := os.Stat(p); err != nil {
				r.Paths[p] = err.Error()
			} else {
				r.Paths[p] = ""
			}
		}
		if b, err := os.ReadFile(args[0]); err == nil {
			r.Read = string(b)
		}
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			if pid, err := strconv.Atoi(e.Name()); err == nil {
				r.Pids = append(r.Pids, pid)
			}
		}
		_ = json.NewEncoder(os.Stdout).Encode(r)
		return 0
	case "hold":
		fmt.Println("holding")
		time.Sleep(time.Hour)
		return 0
	case "threads":
		// Each goroutine that locks its thread and never returns keeps one OS thread; the Go
		// runtime dies ("failed to create new OS thread", errno=11) when the kernel refuses one.
		want, _ := strconv.Atoi(args[0])
		var wg sync.WaitGroup
		for range want {
			wg.Add(1)
			go func() {
				runtime.LockOSThread()
				wg.Done()
				select {}
			}()
		}
		wg.Wait()
		fmt.Printf("created %d threads\n", want)
		return 0
	case "allocate", "allocate-hold":
		// Touch every page, so that the memory is really taken; allocate-hold keeps it.
		mib, _ := strconv.Atoi(args[0])
		var keep [][]byte
		for range mib {
			b := make([]byte, 1<<20)
			for i := range b {
				b[i] = 1
			}
			keep = append(keep, b)
		}
		fmt.Printf("allocated %d MiB\n", len(keep))
		if mode == "allocate-hold" {
			time.Sleep(time.Hour)
			runtime.KeepAlive(keep)
		}
		return 0
	case "new":
		_, err := New(Config{})
		fmt.Println(err)
		return 0
	}
	return 3
}
