package sandbox

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestOwnCgroupsFindsTheRuntimesCgroupInEachHierarchy(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                  string
		procCgroup, mountinfo string
		want                  []hierarchy
	}{
		{
			name:       "hybrid: memory, cpu and pids on v1, an empty v2 beside them",
			procCgroup: "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/e92\n2:cpuacct:/\n1:cpu:/\n0::/\n",
			mountinfo: "30 25 0:26 / /sys/fs/cgroup ro - tmpfs tmpfs ro\n" +
				"31 30 0:27 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n" +
				"32 30 0:28 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct\n" +
				"33 30 0:29 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n" +
				"34 30 0:30 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n" +
				"35 30 0:31 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd\n" +
				"36 30 0:32 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n",
			want: []hierarchy{
				{controllers: []string{"pids"}, dir: "/sys/fs/cgroup/pids/"},
				{controllers: []string{"memory"}, dir: "/sys/fs/cgroup/memory/process_api/e92"},
				{controllers: []string{"cpu"}, dir: "/sys/fs/cgroup/cpu/"},
				{v2: true, dir: "/sys/fs/cgroup/unified/"},
			},
		},
		{
			name:       "v1 with cpu and cpuacct mounted together",
			procCgroup: "3:cpu,cpuacct:/svc\n",
			mountinfo:  "31 30 0:27 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n",
			want:       []hierarchy{{controllers: []string{"cpu"}, dir: "/sys/fs/cgroup/cpu,cpuacct/svc"}},
		},
		{
			name:       "pure v2 in a delegated service",
			procCgroup: "0::/system.slice/takoserver.service\n",
			mountinfo:  "36 25 0:32 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n",
			want:       []hierarchy{{v2: true, dir: "/sys/fs/cgroup/system.slice/takoserver.service"}},
		},
		{
			name:       "v2 mounted from the container's own cgroup",
			procCgroup: "0::/kubepods/pod1/c1\n",
			mountinfo:  "36 25 0:32 /kubepods/pod1/c1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
			want:       []hierarchy{{v2: true, dir: "/sys/fs/cgroup"}},
		},
		{
			name:       "a mount that does not show the runtime's cgroup is no use",
			procCgroup: "0::/elsewhere\n",
			mountinfo:  "36 25 0:32 /kubepods /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
		},
		{
			name:       "a mount point with a space",
			procCgroup: "0::/a\n",
			mountinfo:  `36 25 0:32 / /mnt/cg\040two rw - cgroup2 cgroup2 rw` + "\n",
			want:       []hierarchy{{v2: true, dir: "/mnt/cg two/a"}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ownCgroups([]byte(tc.procCgroup), []byte(tc.mountinfo))
			for i := range got {
				// filepath.Join cleans; compare cleaned paths.
				got[i].dir = cleanDir(got[i].dir)
			}
			for i := range tc.want {
				tc.want[i].dir = cleanDir(tc.want[i].dir)
			}
			require.Equal(t, tc.want, got)
		})
	}
}

func cleanDir(d string) string {
	for len(d) > 1 && d[len(d)-1] == '/' {
		d = d[:len(d)-1]
	}
	return d
}

func TestParseLoaderListNamesTheInterpreterAndEveryLibrary(t *testing.T) {
	t.Parallel()
	out := "\tlinux-vdso.so.1 (0x00007ffd)\n" +
		"\tlibm.so.6 => /lib/x86_64-linux-gnu/libm.so.6 (0x00007f62)\n" +
		"\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f63)\n" +
		"\t/lib64/ld-linux-x86-64.so.2 (0x00007f64)\n"
	libs, err := parseLoaderList([]byte(out), "/lib64/ld-linux-x86-64.so.2")
	require.NoError(t, err)
	require.Equal(t, []string{"/lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu/libm.so.6", "/lib/x86_64-linux-gnu/libc.so.6"}, libs)

	_, err = parseLoaderList([]byte("\tlibfoo.so.1 => not found\n"), "/lib64/ld-linux-x86-64.so.2")
	require.ErrorContains(t, err, "libfoo.so.1 is not found")
}

func TestSetIDCapabilitiesAreReadFromCapEff(t *testing.T) {
	t.Parallel()
	require.True(t, hasSetIDCapabilities([]byte("Name:\tx\nCapEff:\t00000000000000c1\n")))
	require.True(t, hasSetIDCapabilities([]byte("CapEff:\t000001ffffffffff\n")))
	require.False(t, hasSetIDCapabilities([]byte("CapEff:\t0000000000000080\n")), "CAP_SETUID alone")
	require.False(t, hasSetIDCapabilities([]byte("CapEff:\t00000000000000c0\n")), "without CAP_CHOWN")
	require.False(t, hasSetIDCapabilities([]byte("CapEff:\t0000000000000000\n")))
	require.False(t, hasSetIDCapabilities([]byte("CapPrm:\t00000000000000c0\n")))
}

func TestAllocateUIDNeverGivesRootTheNodesUIDATakenOrAHeldOne(t *testing.T) {
	t.Parallel()
	r := UIDRange{First: 1000, Last: 1005}
	taken := func(uid int) bool { return uid == 1002 }
	held := map[string]int{"acme": 1000}
	uid, err := AllocateUID(r, held, 1001, taken)
	require.NoError(t, err)
	require.Equal(t, 1003, uid, "1000 is acme's, 1001 the node's own, 1002 an account of the machine")
	held["dev"] = uid
	uid, err = AllocateUID(r, held, 1001, taken)
	require.NoError(t, err)
	require.Equal(t, 1004, uid)
	held["x"], held["y"] = 1004, 1005
	_, err = AllocateUID(r, held, 1001, taken)
	require.ErrorIs(t, err, ErrUIDsExhausted)

	_, err = AllocateUID(UIDRange{First: 0, Last: 10}, nil, 1001, nil)
	require.ErrorContains(t, err, "holds root")
}

func TestParseUIDRange(t *testing.T) {
	t.Parallel()
	r, err := ParseUIDRange("200000-299999")
	require.NoError(t, err)
	require.Equal(t, DefaultUIDRange, r)
	require.Equal(t, "200000-299999", r.String())
	for _, bad := range []string{"", "200000", "0-10", "-5-10", "20-10", "a-b", "1-4294967295"} {
		_, err := ParseUIDRange(bad)
		require.Error(t, err, bad)
	}
}

func TestBwrapArgsIsolateAndCarryNoEnvironment(t *testing.T) {
	t.Parallel()
	p := Program{Files: []string{"config.capnp", "router.js"}, Args: []string{"serve", "config.capnp"}}
	args := bwrapArgs([]string{"/lib64/ld.so"}, sandboxFDs{bin: 4, status: 5, block: 6, bind: -1}, p, []int{7, 8})
	for _, flag := range []string{"--unshare-user", "--unshare-pid", "--unshare-ipc", "--disable-userns", "--die-with-parent", "--new-session"} {
		require.Contains(t, args, flag)
	}
	require.NotContains(t, args, "--unshare-net", "a program keeps the host's network unless told otherwise")
	require.NotContains(t, args, "--setenv", "argv is world-readable in /proc/<pid>/cmdline")
	require.NotContains(t, args, "--bind", "nothing of the host is writable inside")
	require.NotContains(t, args, "--bind-fd", "nothing of the host is writable inside")
	require.Contains(t, strings.Join(args, " "), "--ro-bind-data 7 "+WorkDir+"/config.capnp --ro-bind-data 8 "+WorkDir+"/router.js")
	require.Equal(t, []string{"--json-status-fd", "5", "--block-fd", "6", "/proc/self/fd/4", "serve", "config.capnp"}, args[len(args)-7:])

	// An org process: no network of its own, and its socket directory, bound from a descriptor,
	// the one writable place (a mount of its own, made before / turns read-only).
	p.NoNetwork, p.BindAt = true, "/sockets"
	args = bwrapArgs([]string{"/lib64/ld.so"}, sandboxFDs{bin: 4, status: 5, block: 6, bind: 9}, p, []int{7, 8})
	require.Contains(t, args, "--unshare-net")
	joined := strings.Join(args, " ")
	require.Contains(t, joined, "--bind-fd 9 /sockets --remount-ro /")
}
