package cloudflare

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"
)

// responseDumper is what the SDK's API error offers without exposing its type (which lives in
// an internal package of the SDK): the response it met.
type responseDumper interface {
	DumpResponse(body bool) []byte
}

// AsAPIError reads an SDK error as Cloudflare's answer: nil, false when err is not an answer of
// the API (a transport failure, a lost answer, a cancelled context). Only the response is read,
// never the request, so the token cannot leak into the value.
func AsAPIError(err error) (*APIError, bool) {
	if err == nil {
		return nil, false
	}
	var mine *APIError
	if errors.As(err, &mine) {
		return mine, true
	}
	var d responseDumper
	if !errors.As(err, &d) {
		return nil, false
	}
	res, rerr := http.ReadResponse(bufio.NewReader(bytes.NewReader(d.DumpResponse(true))), nil)
	if rerr != nil {
		return nil, false
	}
	defer res.Body.Close()
	out := &APIError{Status: res.StatusCode}
	if s, perr := strconv.Atoi(res.Header.Get("Retry-After")); perr == nil && s > 0 {
		out.RetryAfter = time.Duration(s) * time.Second
	}
	body, _ := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	var env struct {
		Errors []ErrorEntry `json:"errors"`
	}
	if json.Unmarshal(body, &env) == nil {
		out.Errors = env.Errors
	}
	return out, true
}
