package server

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/ownership"
)

// bodyLimitKey holds, in a request's context, a body limit other than Config.BodyLimit (a worker
// PUT's, which carries a bundle).
const bodyLimitKey = "takoform.bodyLimit"

// readBody reads the whole request body, refusing one over the limit, compressed or decompressed.
// A body may come gzip-compressed (Content-Encoding: gzip); any other encoding is refused (415).
// The request hash is over what this returns: the decompressed body.
func (s *Server) readBody(c echo.Context) ([]byte, error) {
	r := c.Request()
	limit := s.cfg.BodyLimit
	if l, ok := c.Get(bodyLimitKey).(int64); ok && l > limit {
		limit = l
	}
	tooLarge := apierr.New(apierr.BodyTooLarge, "request bodies are limited to %d bytes here, compressed or not", limit)
	if r.ContentLength > limit {
		return nil, tooLarge
	}
	var in io.Reader = http.MaxBytesReader(c.Response(), r.Body, limit)
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get(echo.HeaderContentEncoding))); enc {
	case "", "identity":
	case "gzip":
		gz, err := gzip.NewReader(in)
		if err != nil {
			return nil, apierr.New(apierr.BadRequest, "the body is not gzip, as its Content-Encoding says")
		}
		defer gz.Close()
		// Decompressed, the body is bounded like a plain one: a small body that inflates past
		// the limit (a gzip bomb) is refused as it streams, never held whole.
		in = io.LimitReader(gz, limit+1)
	default:
		return nil, apierr.New(apierr.UnsupportedMedia, "Content-Encoding %q is not taken: send the body plain or gzip", enc)
	}
	body, err := io.ReadAll(in)
	var maxBytes *http.MaxBytesError
	switch {
	case errors.As(err, &maxBytes) || int64(len(body)) > limit:
		return nil, tooLarge
	case err != nil:
		return nil, apierr.New(apierr.BadRequest, "could not read the request body")
	}
	return body, nil
}

// decodeJSON reads a JSON object body into v strictly: the content type must be JSON, unknown
// fields are refused and nothing may follow the object. It returns the raw body for hashing.
func (s *Server) decodeJSON(c echo.Context, v any) ([]byte, error) {
	ct := c.Request().Header.Get(echo.HeaderContentType)
	if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
		return nil, apierr.New(apierr.UnsupportedMedia, "send the body as application/json")
	}
	body, err := s.readBody(c)
	if err != nil {
		return nil, err
	}
	if err := storable(body); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return nil, apierr.New(apierr.BadRequest, "invalid JSON body: %s", describeJSONError(err))
	}
	if dec.More() {
		return nil, apierr.New(apierr.BadRequest, "invalid JSON body: unexpected data after the object")
	}
	return body, nil
}

// storable refuses, before anything is decoded, a body holding a value PostgreSQL cannot store:
// bytes that are not UTF-8, a NUL character or a lone UTF-16 surrogate escaped in any string (Go's
// decoder would turn a lone surrogate into U+FFFD silently, and text and jsonb refuse NUL), and a
// number that is not an integer within 64 bits (every number of the API is one). Such a body is a
// bad request, never a database error.
func storable(body []byte) error {
	if !utf8.Valid(body) {
		return apierr.New(apierr.BadRequest, "invalid JSON body: it is not UTF-8")
	}
	inString := false
	for i := 0; i < len(body); i++ {
		switch {
		case body[i] == '"':
			inString = !inString
		case inString && body[i] == '\\' && i+1 < len(body):
			i++
			if body[i] != 'u' {
				continue
			}
			r, ok := hex4(body, i+1)
			if !ok {
				continue // the decoder reports the syntax error
			}
			i += 4
			switch {
			case r == 0:
				return apierr.New(apierr.BadRequest, "invalid JSON body: a string holds the NUL character (\\u0000), which cannot be stored")
			case utf16.IsSurrogate(r) && r < 0xdc00:
				// A high surrogate must be followed at once by an escaped low one.
				if i+2 < len(body) && body[i+1] == '\\' && body[i+2] == 'u' {
					if low, ok := hex4(body, i+3); ok && low >= 0xdc00 && low <= 0xdfff {
						i += 6
						continue
					}
				}
				return apierr.New(apierr.BadRequest, "invalid JSON body: a string holds a lone UTF-16 surrogate escape, which is no character")
			case utf16.IsSurrogate(r):
				return apierr.New(apierr.BadRequest, "invalid JSON body: a string holds a lone UTF-16 surrogate escape, which is no character")
			}
		}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil // the end, or a syntax error the decoder reports
		}
		if n, ok := tok.(json.Number); ok {
			if _, err := strconv.ParseInt(n.String(), 10, 64); err != nil {
				return apierr.New(apierr.BadRequest, "invalid JSON body: numbers must be integers within 64 bits")
			}
		}
	}
}

// hex4 reads the four hex digits of a \\u escape at body[at:].
func hex4(body []byte, at int) (rune, bool) {
	if at+4 > len(body) {
		return 0, false
	}
	n, err := strconv.ParseUint(string(body[at:at+4]), 16, 16)
	return rune(n), err == nil
}

// describeJSONError words a decoding error without echoing body contents.
func describeJSONError(err error) string {
	var syntax *json.SyntaxError
	var typeErr *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syntax):
		return "syntax error"
	case errors.As(err, &typeErr):
		if typeErr.Field != "" {
			return "field " + typeErr.Field + " has the wrong type"
		}
		return "the body must be a JSON object"
	case errors.Is(err, io.EOF):
		return "the body is empty"
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return "unknown field " + strings.TrimPrefix(err.Error(), "json: unknown field ")
	default:
		return "the body could not be decoded"
	}
}

// ownershipToken returns the request's ownership token, refusing a request without one (428).
func ownershipToken(c echo.Context) (string, error) {
	token := c.Request().Header.Get(ownership.TokenHeader)
	if token == "" {
		return "", apierr.New(apierr.OwnershipRequired, "send %s on every PUT and DELETE", ownership.TokenHeader)
	}
	return token, nil
}

// OperationHeader names the operation ledger entry of a mutating request.
const OperationHeader = "Takoform-Operation-Id"

// setOperation names the request's ledger entry on its answer, refusals included.
func setOperation(c echo.Context, resp ownership.Response) {
	if resp.Operation != uuid.Nil {
		c.Response().Header().Set(OperationHeader, resp.Operation.String())
	}
}

// writeOwned sends an owned mutation's response, marking replays.
func writeOwned(c echo.Context, resp ownership.Response) error {
	if resp.Replayed {
		c.Response().Header().Set(ownership.ReplayedHeader, "true")
	}
	return c.Blob(resp.Status, echo.MIMEApplicationJSON, resp.Body)
}
