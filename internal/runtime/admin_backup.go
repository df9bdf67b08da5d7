package runtime

import (
	"io"
	"net/http"
	"os"
	"strconv"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
)

// backup answers a consistent backup of the node's state (state.Store.Backup). It is written
// under the node's lock into a private file of the state directory first, so that a slow reader
// never holds the node's changes back, then sent and removed.
func (n *Node) backup(w http.ResponseWriter, r *http.Request) {
	f, err := os.CreateTemp(n.store.Dir(), ".backup-*")
	if err != nil {
		n.writeProblem(w, r, adminapi.NewProblem(http.StatusInternalServerError, adminapi.CodeInternal, "Internal Server Error", "the backup could not be written"))
		return
	}
	defer os.Remove(f.Name())
	defer f.Close()
	n.mu.RLock()
	err = n.store.Backup(f, n.desired)
	n.mu.RUnlock()
	if err == nil {
		_, err = f.Seek(0, io.SeekStart)
	}
	info, statErr := f.Stat()
	if err != nil || statErr != nil {
		n.log.Error("backup", "error", err)
		n.writeProblem(w, r, adminapi.NewProblem(http.StatusInternalServerError, adminapi.CodeInternal, "Internal Server Error", "the backup could not be written"))
		return
	}
	w.Header().Set("Content-Type", "application/gzip")
	w.Header().Set("Content-Length", strconv.FormatInt(info.Size(), 10))
	w.Header().Set("Cache-Control", "no-store")
	if _, err := io.Copy(w, f); err != nil {
		n.log.Warn("backup: the reader went away", "error", err.Error())
		return
	}
	n.log.Info("backup written", "bytes", info.Size())
}
