package runtime_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend/selfhost"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
)

// loggingSource prints one line per request, naming its version and the request's path.
func loggingSource(version string) string {
	return `export default {
  fetch(req) {
    console.log("` + version + ` " + new URL(req.url).pathname);
    return new Response("` + version + `\n");
  }
};`
}

func (f *fixture) logs(name string, q adminapi.LogQuery) (adminapi.LogPage, error) {
	f.t.Helper()
	return f.client.Logs(f.ctx, name, q)
}

func messages(p adminapi.LogPage) []string {
	var out []string
	for _, e := range p.Entries {
		out = append(out, e.Message)
	}
	return out
}

// A worker's log holds what each of its incarnations printed, in order and named by incarnation,
// across a code change; only its own worker UID reads it; a long poll answers as soon as a line
// arrives; and the log goes with the script's delete, so the next worker of that script name
// starts with an empty one.
func TestWorkerLogSpansIncarnationsAndGoesWithItsWorker(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const host = "logged.workers.localhost"
	put := f.scriptPut("uid-a", 1, "v1")
	put.Modules = map[string]string{"main.js": loggingSource("v1")}
	_, err := f.client.PutScript(f.ctx, "logged", put)
	require.NoError(t, err)
	f.route(host, "logged", "ep-a")
	first := f.waitReady("logged")
	f.answers(host, "v1\n")

	var page adminapi.LogPage
	require.Eventually(t, func() bool {
		page, err = f.logs("logged", adminapi.LogQuery{WorkerUID: "uid-a"})
		return err == nil && len(page.Entries) > 0
	}, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, "v1 /", page.Entries[0].Message)
	require.Equal(t, adminapi.LevelLog, page.Entries[0].Level)
	require.Equal(t, first.Incarnation.ID, page.Entries[0].Incarnation)

	_, err = f.logs("logged", adminapi.LogQuery{WorkerUID: "uid-other"})
	require.True(t, selfhost.IsCode(err, adminapi.CodeScriptAbsent), "another worker UID reads nothing: %v", err)

	// A long poll from the cursor, waiting with nothing to answer, answers with the next line as
	// soon as it is printed.
	type polled struct {
		page adminapi.LogPage
		err  error
	}
	got := make(chan polled, 1)
	go func() {
		p, err := f.client.Logs(f.ctx, "logged", adminapi.LogQuery{WorkerUID: "uid-a", Epoch: page.Epoch, After: page.Next, Wait: 20 * time.Second})
		got <- polled{p, err}
	}()
	require.Eventually(t, func() bool { return f.h.Node.LogPollsWaiting() == 1 }, 10*time.Second, 5*time.Millisecond, "the long poll waits")
	started := time.Now()
	code, _, _ := f.h.Get(t, host, "/polled")
	require.Equal(t, http.StatusOK, code)
	select {
	case p := <-got:
		require.NoError(t, p.err)
		require.Equal(t, []string{"v1 /polled"}, messages(p.page))
		require.Less(t, time.Since(started), 10*time.Second)
		page = p.page
	case <-time.After(20 * time.Second):
		t.Fatal("the long poll never answered")
	}

	// A code change: the next incarnation's lines follow in the same log, under its own name.
	put = f.scriptPut("uid-a", 2, "v2")
	put.Modules = map[string]string{"main.js": loggingSource("v2")}
	_, err = f.client.PutScript(f.ctx, "logged", put)
	require.NoError(t, err)
	second := f.waitStatus("generation 2 serving", func(s adminapi.ScriptStatus) bool { return s.Ready && s.Incarnation.Generation == 2 }, "logged")
	require.NotEqual(t, first.Incarnation.ID, second.Incarnation.ID)
	f.answers(host, "v2\n")
	require.Eventually(t, func() bool {
		page, err = f.logs("logged", adminapi.LogQuery{WorkerUID: "uid-a"})
		return err == nil && strings.Contains(strings.Join(messages(page), "|"), "v2 /")
	}, 10*time.Second, 20*time.Millisecond)
	last := page.Entries[len(page.Entries)-1]
	require.Equal(t, second.Incarnation.ID, last.Incarnation)
	require.Equal(t, "v1 /", page.Entries[0].Message)

	// The delete takes the log with it; another worker of the same script name starts afresh.
	_, err = f.client.DeleteScript(f.ctx, "logged", "uid-a")
	require.NoError(t, err)
	_, err = f.logs("logged", adminapi.LogQuery{WorkerUID: "uid-a"})
	require.True(t, selfhost.IsCode(err, adminapi.CodeScriptAbsent), "a deleted worker's log is gone: %v", err)
	put = f.scriptPut("uid-b", 3, "v3")
	put.Modules = map[string]string{"main.js": loggingSource("v3")}
	_, err = f.client.PutScript(f.ctx, "logged", put)
	require.NoError(t, err)
	f.waitReady("logged")
	f.answers(host, "v3\n")
	require.Eventually(t, func() bool {
		page, err = f.logs("logged", adminapi.LogQuery{WorkerUID: "uid-b"})
		return err == nil && len(page.Entries) > 0
	}, 10*time.Second, 20*time.Millisecond)
	for _, m := range messages(page) {
		require.True(t, strings.HasPrefix(m, "v3 "), "the new worker sees only its own lines, not %q", m)
	}
}

// TestRuleTheNodeHoldsABoundedNumberOfLogLongPolls: at most adminapi.MaxLogWaits log long polls
// wait at once; one more is 429 log_waits_full at once, so that log streams never take the admin
// API's connections (nor the node's descriptors) from everything else. A poll that ends gives
// its place back.
func TestRuleTheNodeHoldsABoundedNumberOfLogLongPolls(t *testing.T) {
	t.Parallel()
	f, _ := setupWithoutWorkerd(t)
	f.script("logged", "uid-a", 1, "v1")
	f.waitReady("logged")
	ctx, cancel := context.WithCancel(f.ctx)
	defer cancel()
	var polls sync.WaitGroup
	for range adminapi.MaxLogWaits {
		polls.Add(1)
		go func() {
			defer polls.Done()
			_, _ = f.client.Logs(ctx, "logged", adminapi.LogQuery{WorkerUID: "uid-a", Wait: 25 * time.Second})
		}()
	}
	require.Eventually(t, func() bool { return f.h.Node.LogPollsWaiting() == adminapi.MaxLogWaits }, 20*time.Second, 10*time.Millisecond,
		"every long poll waits: %d", f.h.Node.LogPollsWaiting())
	started := time.Now()
	_, err := f.client.Logs(f.ctx, "logged", adminapi.LogQuery{WorkerUID: "uid-a", Wait: 25 * time.Second})
	require.True(t, selfhost.IsCode(err, adminapi.CodeLogWaitsFull), "one more: %v", err)
	require.Less(t, time.Since(started), 5*time.Second, "refused at once, not after a wait")
	_, err = f.client.Logs(f.ctx, "logged", adminapi.LogQuery{WorkerUID: "uid-a"})
	require.NoError(t, err, "a read that does not wait is never refused")

	cancel()
	polls.Wait()
	require.Eventually(t, func() bool { return f.h.Node.LogPollsWaiting() == 0 }, 10*time.Second, 10*time.Millisecond)
	_, err = f.client.Logs(f.ctx, "logged", adminapi.LogQuery{WorkerUID: "uid-a", Wait: 10 * time.Millisecond})
	require.NoError(t, err, "the places came back")
}
