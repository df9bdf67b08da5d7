package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd/workerdtest"
)

func TestCommandPrintsWhereItServesAndKeepsTheTokenInA0600File(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := filepath.Join(t.TempDir(), "state")
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--listen", "127.0.0.1:0", "--state-dir", dir, "--workerd", workerdtest.Binary(t)}, pw)
		_ = pw.Close()
	}()
	printed := map[string]string{}
	var all strings.Builder
	sc := bufio.NewScanner(pr)
	for len(printed) < 9 && sc.Scan() {
		all.WriteString(sc.Text() + "\n")
		k, v, ok := strings.Cut(sc.Text(), "=")
		require.True(t, ok, sc.Text())
		printed[k] = v
	}
	require.Len(t, printed, 9, all.String())

	info, err := os.Stat(printed["CFSTANDIN_TOKEN_FILE"])
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	dirInfo, err := os.Stat(dir)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), dirInfo.Mode().Perm())
	tokenBytes, err := os.ReadFile(printed["CFSTANDIN_TOKEN_FILE"])
	require.NoError(t, err)
	token := strings.TrimSpace(string(tokenBytes))
	require.NotContains(t, all.String(), token, "the token is never printed")

	req, err := http.NewRequest(http.MethodGet, printed["CFSTANDIN_API_BASE_URL"]+"accounts/"+printed["CFSTANDIN_ACCOUNT_ID"]+"/workers/subdomain", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(res.Body)
	_ = res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode, string(body))
	require.Contains(t, string(body), `"subdomain":"takoform-demo"`)
	require.NotEmpty(t, printed["CFSTANDIN_EDGE_ADDR"])

	cancel()
	require.NoError(t, <-done)
}

func TestCommandRefusesATokenFileOthersCanRead(t *testing.T) {
	file := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(file, []byte("tok\n"), 0o644))
	require.NoError(t, os.Chmod(file, 0o644))
	err := run(context.Background(), []string{"--listen", "127.0.0.1:0", "--token-file", file, "--workerd", workerdtest.Binary(t)}, io.Discard)
	require.ErrorContains(t, err, "mode 0600")
}
