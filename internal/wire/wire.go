// Package wire turns projections into the bytes a response carries and a replay returns.
package wire

import (
	"encoding/json"
	"fmt"
)

// JSON marshals a projection. Projections are plain structs, so a failure is a programming error.
func JSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("marshal %T: %v", v, err))
	}
	return b
}
