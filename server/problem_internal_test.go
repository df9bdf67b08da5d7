package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend"
)

// An unreachable backend on a path that does not answer with a problem of its own (the recovery
// of an interrupted operation, reading a pool member back) answers 503 backend_unreachable, which
// the provider retries, with Retry-After and without its cause; any other unnamed error is 500.
func TestAnUnreachableBackendWrappedAnywhereAnswers503(t *testing.T) {
	t.Parallel()
	s := &Server{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	e := echo.New()
	for name, c := range map[string]struct {
		err    error
		status int
		code   string
	}{
		"wrapped": {fmt.Errorf("recover: read back worker w: node node-2: %w", backend.ErrUnreachable), http.StatusServiceUnavailable, "backend_unreachable"},
		"joined":  {errors.Join(errors.New("node node-1: absent"), fmt.Errorf("node node-2: %w", backend.ErrUnreachable)), http.StatusServiceUnavailable, "backend_unreachable"},
		"other":   {errors.New("recover: read back worker w: boom"), http.StatusInternalServerError, "internal"},
	} {
		rec := httptest.NewRecorder()
		s.handleError(c.err, e.NewContext(httptest.NewRequest(http.MethodPut, "/v1/spaces/prod/workers/w", nil), rec))
		require.Equal(t, c.status, rec.Code, name)
		var p map[string]any
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &p), name)
		require.Equal(t, c.code, p["code"], name)
		require.NotContains(t, p["detail"], "node-2", "%s: the cause stays in the log", name)
		if c.status == http.StatusServiceUnavailable {
			require.NotEmpty(t, rec.Header().Get("Retry-After"), name)
		}
	}
}
