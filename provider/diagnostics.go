package provider

import (
	"errors"
	"fmt"

	"github.com/takoform/terraform-provider-takoform/internal/client"
)

// describe words a client error for a diagnostic, with the Host's problem code and detail.
func describe(err error) string {
	var e *client.Error
	if errors.As(err, &e) {
		msg := fmt.Sprintf("%s (code %s, HTTP %d)", e.Detail, e.Code, e.Status)
		if e.RequestID != "" {
			msg += fmt.Sprintf("; request id %s", e.RequestID)
		}
		return msg
	}
	return err.Error()
}
