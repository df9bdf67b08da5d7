package runtime

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

// maxBody bounds a request body: a bundle's modules travel in one script PUT.
const maxBody = 32 << 20

// idPattern is an effect id of the admin API.
var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$`)

// invalid is the 422 problem of a request that is not well formed.
func invalid(format string, args ...any) error {
	return adminapi.NewProblem(http.StatusUnprocessableEntity, adminapi.CodeInvalidRequest, "Invalid request", fmt.Sprintf(format, args...))
}

// decode reads a request body into v: one JSON object of known fields within maxBody.
func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return adminapi.NewProblem(http.StatusRequestEntityTooLarge, adminapi.CodeInvalidRequest, "Request too large", fmt.Sprintf("bodies are limited to %d bytes", maxBody))
		}
		// The decoder's message can quote the body, which may carry a secret: name only the kind.
		return invalid("the body is not the expected JSON object")
	}
	return nil
}

// scriptName is the request path's script name, when well formed.
func scriptName(r *http.Request) (string, error) {
	name := r.PathValue("scriptName")
	if !vocab.Name.MatchString(name) {
		return "", invalid("script name %q does not match %s", name, vocab.NamePattern)
	}
	return name, nil
}

// hostname is the request path's hostname, when a lowercase DNS name.
func hostname(r *http.Request) (string, error) {
	h := r.PathValue("hostname")
	if !vocab.IsHostname(h) {
		return "", invalid("hostname %q must be a lowercase DNS name without a port", h)
	}
	return h, nil
}

// checkID refuses an id field (effect, delivery, deployment, endpoint) that is not well formed.
func checkID(field, v string) error {
	if !idPattern.MatchString(v) {
		return invalid("%s %q must match %s", field, v, idPattern)
	}
	return nil
}
