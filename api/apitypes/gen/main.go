// Command gen writes apitypes.gen.go from api/openapi.yaml with oapi-codegen (the tool pinned in
// go.mod, run with oapi-codegen.yaml beside it). oapi-codegen orders a struct's fields by name
// unless a property carries x-order, and encoding/json writes them in that order; so gen first
// gives every property of the document its x-order (its place in the document), which keeps each
// response's keys in the order the document lists them. The document itself is not changed.
//
// Run from api/apitypes: go run ./gen [-o apitypes.gen.go].
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"

	"go.yaml.in/yaml/v3"
)

func main() {
	out := flag.String("o", "apitypes.gen.go", "the file to write")
	doc := flag.String("doc", "../openapi.yaml", "the OpenAPI document")
	flag.Parse()
	if err := run(*doc, *out); err != nil {
		fmt.Fprintln(os.Stderr, "apitypes/gen:", err)
		os.Exit(1)
	}
}

func run(docPath, out string) error {
	raw, err := os.ReadFile(docPath)
	if err != nil {
		return err
	}
	var root yaml.Node
	if err := yaml.Unmarshal(raw, &root); err != nil {
		return fmt.Errorf("parse %s: %w", docPath, err)
	}
	order(&root)
	ordered, err := yaml.Marshal(&root)
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "apitypes-gen-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	in := filepath.Join(tmp, "openapi.yaml")
	if err := os.WriteFile(in, ordered, 0o600); err != nil {
		return err
	}
	abs, err := filepath.Abs(out)
	if err != nil {
		return err
	}
	cmd := exec.Command("go", "tool", "oapi-codegen", "-config", "oapi-codegen.yaml", "-o", abs, in)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	return cmd.Run()
}

// order sets x-order on every property of every properties mapping under n, 1-based, in the
// order the document lists them.
func order(n *yaml.Node) {
	if n.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == "properties" && n.Content[i+1].Kind == yaml.MappingNode {
				props := n.Content[i+1]
				for j := 0; j+1 < len(props.Content); j += 2 {
					setOrder(props.Content[j+1], j/2+1)
				}
			}
		}
	}
	for _, c := range n.Content {
		order(c)
	}
}

func setOrder(schema *yaml.Node, pos int) {
	if schema.Kind != yaml.MappingNode {
		return
	}
	schema.Style = 0 // block style, so the added key needs no flow syntax
	schema.Content = append(schema.Content,
		&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: "x-order"},
		&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.Itoa(pos)})
}
