package edge

import (
	"math"
	"syscall"
)

// DescriptorReserve is how many of the process's file descriptors the edge's client connections
// leave to the node's own use, when the limit allows as many: each org process's sockets (ingress,
// code, egress, tails) and pipes, the liveness probes of every process each second, egress
// subrequests (one descriptor accepted from workerd and one dialed), the admin API, state and
// cgroup files. The node must keep these when clients take all they may, or its probes fail for a
// reason of its own and workers are killed for it (SPEC 5.1).
const DescriptorReserve = 4096

// MaxConnsForDescriptors is the most client connections the edge holds with a descriptor limit
// of nofile: what is left after the reserve (DescriptorReserve, or half of nofile when that is
// smaller), halved, since each client connection with a request in flight also holds a connection
// to its worker's socket. With 20,000 descriptors that is 7,952; with 1,024, 256.
func MaxConnsForDescriptors(nofile uint64) int {
	reserve := min(uint64(DescriptorReserve), nofile/2)
	n := (nofile - reserve) / 2
	return int(min(max(n, 1), math.MaxInt32))
}

// RaiseDescriptorLimit raises the process's soft RLIMIT_NOFILE to its hard limit and returns both
// as they are then. The runtime node calls it at start-up, before it builds the edge's server
// (whose total cap it bounds, see MaxConnsForDescriptors). Go itself raises the soft limit to
// one below the hard limit when a program starts, and puts the original back for the processes
// it starts (workerd); a limit already that high is left alone, so that they keep it.
func RaiseDescriptorLimit() (soft, hard uint64, err error) {
	soft, hard, err = descriptorLimit()
	if err != nil || hard == 0 || soft >= hard-1 {
		return soft, hard, err
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: hard, Max: hard}); err != nil {
		return soft, hard, err
	}
	return descriptorLimit()
}

// descriptorLimit is the process's RLIMIT_NOFILE.
func descriptorLimit() (soft, hard uint64, err error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, 0, err
	}
	return lim.Cur, lim.Max, nil
}
