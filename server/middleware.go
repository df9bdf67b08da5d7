package server

import (
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/ratebudget"
)

// RequestIDHeader carries the request id in and out.
const RequestIDHeader = "X-Request-Id"

const (
	ctxRequestID = "takoform.request_id"
	ctxPrincipal = "takoform.principal"
	// ctxProblemCode is the problem code a failed request answered, for its log line.
	ctxProblemCode = "takoform.problem_code"
)

var requestIDShape = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)

func requestID(c echo.Context) string {
	id, _ := c.Get(ctxRequestID).(string)
	return id
}

func routeOf(c echo.Context) string {
	if p := c.Path(); p != "" {
		return p
	}
	return "unmatched"
}

// withRequestID adopts a well-formed incoming X-Request-Id or makes one, and echoes it back.
func withRequestID(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		id := c.Request().Header.Get(RequestIDHeader)
		if !requestIDShape.MatchString(id) {
			b := make([]byte, 12)
			_, _ = rand.Read(b)
			id = hex.EncodeToString(b)
		}
		c.Set(ctxRequestID, id)
		c.Response().Header().Set(RequestIDHeader, id)
		return next(c)
	}
}

type metrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	problems *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "takoserver_http_requests_total",
			Help: "HTTP requests answered, by method, route and status.",
		}, []string{"method", "route", "status"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "takoserver_http_request_duration_seconds",
			Help:    "Time to answer an HTTP request, by method, route and status.",
			Buckets: prometheus.DefBuckets,
		}, []string{"method", "route", "status"}),
		problems: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "takoserver_http_problems_total",
			Help: "Problem documents answered, by route and problem code (quota_exceeded and rate_limited are both 429; the code tells them apart).",
		}, []string{"route", "code"}),
	}
	reg.MustRegister(m.requests, m.latency, m.problems)
	return m
}

// observe logs and measures every request. The log line never carries headers or bodies: only
// the method, route pattern, status, size, duration, request id and organization.
func (s *Server) observe(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		err := next(c)
		if err != nil {
			s.handleError(err, c)
		}
		status := c.Response().Status
		elapsed := time.Since(start)
		route := routeOf(c)
		labels := prometheus.Labels{"method": c.Request().Method, "route": route, "status": strconv.Itoa(status)}
		s.metrics.requests.With(labels).Inc()
		s.metrics.latency.With(labels).Observe(elapsed.Seconds())
		attrs := []slog.Attr{
			slog.String("request_id", requestID(c)),
			slog.String("method", c.Request().Method),
			slog.String("route", route),
			slog.Int("status", status),
			slog.Int64("bytes", c.Response().Size),
			slog.Float64("duration_ms", float64(elapsed.Microseconds())/1000),
		}
		if code, ok := c.Get(ctxProblemCode).(string); ok {
			attrs = append(attrs, slog.String("code", code))
			s.metrics.problems.WithLabelValues(route, code).Inc()
		}
		if p, ok := c.Get(ctxPrincipal).(auth.Principal); ok {
			attrs = append(attrs, slog.String("organization_id", p.Organization.ID), slog.String("key_id", p.KeyID))
		}
		s.log.LogAttrs(c.Request().Context(), slog.LevelInfo, "request", attrs...)
		return nil
	}
}

// authenticate resolves the bearer key to its organization; each route then checks its scope
// (requireScope).
func (s *Server) authenticate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		header := c.Request().Header.Get(echo.HeaderAuthorization)
		scheme, key, ok := strings.Cut(header, " ")
		if header == "" {
			return apierr.New(apierr.Unauthenticated, "send an organization API key as `Authorization: Bearer <key>`")
		}
		if !ok || !strings.EqualFold(scheme, "Bearer") {
			return apierr.New(apierr.Unauthenticated, "the Authorization header must use the Bearer scheme")
		}
		p, err := s.keys.Authenticate(c.Request().Context(), s.db, strings.TrimSpace(key))
		if err == auth.ErrUnknownKey {
			return apierr.New(apierr.Unauthenticated, "the API key is unknown or revoked")
		}
		if err != nil {
			return err
		}
		c.Set(ctxPrincipal, p)
		// The backend calls this request makes are the organization's: each takes from its share
		// of an installation's API budget too.
		c.SetRequest(c.Request().WithContext(ratebudget.WithOrganization(c.Request().Context(), p.Organization.ID)))
		return next(c)
	}
}

// requireScope refuses a key without scope (403).
func requireScope(scope string) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if !principal(c).Has(scope) {
				return apierr.New(apierr.Forbidden, "this API key lacks the %s scope", scope)
			}
			return next(c)
		}
	}
}

func principal(c echo.Context) auth.Principal {
	p, _ := c.Get(ctxPrincipal).(auth.Principal)
	return p
}
