package server

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/takoform/terraform-provider-takoform/api/apitypes"
	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/backend"
)

// NDJSONContentType is the media type of a streamed log: one JSON object per line.
const NDJSONContentType = "application/x-ndjson"

// logWriteTimeout bounds each write of a log stream (the server's own write timeout would end a
// long follow).
const logWriteTimeout = 30 * time.Second

// DefaultLogStreamMaxAge is how long a log follow stream lasts before the Host ends it.
const DefaultLogStreamMaxAge = time.Hour

func (s *Server) logStreamMaxAge() time.Duration {
	if s.cfg.LogStreamMaxAge > 0 {
		return s.cfg.LogStreamMaxAge
	}
	return DefaultLogStreamMaxAge
}

// getWorkerLogs streams a worker's log as NDJSON (SPEC 3.6): the entries its backend holds
// (since, when given), then, with follow=true, each new one until the client leaves or this Host
// shuts down. Only the worker's organization finds it.
func (s *Server) getWorkerLogs(c echo.Context) error {
	space, name := c.Param("space"), c.Param("name")
	q, err := logQuery(c, time.Now())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(c.Request().Context())
	defer cancel()
	read, err := s.resources.WorkerLogs(ctx, s.db, principal(c).Organization, space, name)
	if err != nil {
		return err
	}
	if q.Follow {
		// Bounded in number per key and organization, and in age: a client that follows for
		// longer reconnects with since.
		release, err := s.streams.open(principal(c).KeyID, principal(c).Organization.ID)
		if err != nil {
			return err
		}
		defer release()
		var stop context.CancelFunc
		ctx, stop = context.WithTimeout(ctx, s.logStreamMaxAge())
		defer stop()
	}
	go func() {
		select {
		case <-s.shutdown:
			cancel()
		case <-ctx.Done():
		}
	}()
	w := c.Response()
	rc := http.NewResponseController(w)
	started := false
	start := func() {
		if started {
			return
		}
		started = true
		w.Header().Set(echo.HeaderContentType, NDJSONContentType)
		w.Header().Set(echo.HeaderCacheControl, "no-store")
		w.Header().Set("X-Accel-Buffering", "no")
		w.WriteHeader(http.StatusOK)
	}
	enc := json.NewEncoder(w)
	each := func(e backend.LogEntry) error {
		start()
		_ = rc.SetWriteDeadline(time.Now().Add(logWriteTimeout))
		// RFC 3339 with nanoseconds is what time.Time encodes to in JSON.
		return enc.Encode(apitypes.LogLine{Time: e.Time.Format(time.RFC3339Nano), Incarnation: e.Incarnation, Level: e.Level, Message: e.Message,
			Dropped: int64(e.Dropped), Missed: int64(e.Missed)})
	}
	flush := func() error {
		start()
		_ = rc.SetWriteDeadline(time.Now().Add(logWriteTimeout))
		return rc.Flush()
	}
	err = read(ctx, q, each, flush)
	if err != nil && !started {
		return err // nothing sent yet: a problem response
	}
	if err != nil && ctx.Err() == nil {
		// The stream has begun: it can only end. The cause goes to the log.
		s.log.Warn("worker log stream ended", "space", space, "worker", name, "error", err.Error(), "request_id", requestID(c))
	}
	return nil
}

// logQuery reads since (an RFC 3339 time, or a duration back from now such as 10m) and follow.
func logQuery(c echo.Context, now time.Time) (backend.LogQuery, error) {
	var q backend.LogQuery
	if v := c.QueryParam("since"); v != "" {
		if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
			q.Since = t
		} else if d, err := time.ParseDuration(v); err == nil && d >= 0 {
			q.Since = now.Add(-d)
		} else {
			return q, apierr.New(apierr.InvalidRequest, "since %q must be an RFC 3339 time or a duration such as 10m", v)
		}
	}
	if v := c.QueryParam("follow"); v != "" {
		f, err := strconv.ParseBool(v)
		if err != nil {
			return q, apierr.New(apierr.InvalidRequest, "follow %q must be true or false", v)
		}
		q.Follow = f
	}
	return q, nil
}
