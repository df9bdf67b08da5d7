package edge_test

import (
	"net/http"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/edge"
)

// The edge's total cap leaves the node its reserve of descriptors, and half of the rest (a client
// connection with a request in flight holds one to its worker too); configured higher, a server
// holds it within the process's limit.
func TestTheTotalConnectionCapLeavesTheNodeItsDescriptors(t *testing.T) {
	t.Parallel()
	for nofile, want := range map[uint64]int{
		20000:   (20000 - edge.DescriptorReserve) / 2,
		1024:    256,
		1:       1,
		1 << 20: (1<<20 - edge.DescriptorReserve) / 2,
	} {
		require.Equal(t, want, edge.MaxConnsForDescriptors(nofile), "nofile %d", nofile)
	}

	var lim syscall.Rlimit
	require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim))
	total, perSource := edge.NewH1Server(http.NotFoundHandler(), edge.Limits{MaxConns: 1 << 30}, nil).ConnCaps()
	require.Equal(t, edge.MaxConnsForDescriptors(lim.Cur), total)
	require.Equal(t, edge.DefaultMaxConnsPerSource, perSource)
	total, _ = edge.NewH1Server(http.NotFoundHandler(), edge.Limits{}, nil).ConnCaps()
	require.Equal(t, min(edge.DefaultMaxConns, edge.MaxConnsForDescriptors(lim.Cur)), total)
}

// RaiseDescriptorLimit raises the soft limit to the hard one. (Not parallel: it changes the
// process's limit, which it lowers first, Go having raised it at start.)
func TestRaiseDescriptorLimitRaisesTheSoftLimit(t *testing.T) {
	var lim syscall.Rlimit
	require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim))
	if lim.Max < 2048 {
		if os.Getenv("CI") == "true" {
			t.Fatalf("the hard descriptor limit (%d) leaves no room to lower the soft one", lim.Max)
		}
		t.Skipf("the hard descriptor limit (%d) leaves no room to lower the soft one", lim.Max)
	}
	lowered := syscall.Rlimit{Cur: lim.Max / 2, Max: lim.Max}
	require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lowered))
	soft, hard, err := edge.RaiseDescriptorLimit()
	require.NoError(t, err)
	require.Equal(t, lim.Max, hard)
	require.Equal(t, hard, soft)
	require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim))
	require.Equal(t, lim.Max, lim.Cur)
}
