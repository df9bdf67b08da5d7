package runtime

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/orgproc"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/state"
	"github.com/takoform/terraform-provider-takoform/internal/safedir"
)

// readImplications reads what the node's last run kept of its incarnations' implications (SPEC
// 5.1), so that a restart of the node forgets neither a quarantine nor an implication of the last
// hour. A file that does not parse is ignored with a warning (and replaced at the next
// implication): it only ever holds what liveness learnt, never what the node was told.
func (n *Node) readImplications() (map[string]orgproc.Record, error) {
	raw, err := safedir.ReadFile(n.store.Dir(), state.ImplicationsFile, n.store.Owner())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the node's implications: %w", err)
	}
	var records map[string]orgproc.Record
	if err := json.Unmarshal(raw, &records); err != nil {
		n.log.Warn("the node's implications do not parse; liveness starts without them", "file", state.ImplicationsFile, "error", err)
		return nil, nil
	}
	return records, nil
}

// keepImplications writes the incarnations' implications for the node's next run.
func (n *Node) keepImplications(records map[string]orgproc.Record) {
	raw, err := json.Marshal(records)
	if err == nil {
		err = safedir.WriteFile(n.store.Dir(), state.ImplicationsFile, raw, n.store.Owner())
	}
	if err != nil {
		n.log.Error("keep the incarnations' implications", "error", err)
	}
}
