// Package api holds the OpenAPI 3 document of the Host's HTTP API.
package api

import _ "embed"

// OpenAPI is the document, as YAML.
//
//go:embed openapi.yaml
var OpenAPI []byte
