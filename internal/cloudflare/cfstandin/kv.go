package cfstandin

import (
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"time"
)

// kvKey keeps a key's recent writes, so that a read can see the key as it was KVStale ago.
type kvKey struct {
	writes []kvWrite // oldest first
}

type kvWrite struct {
	at      time.Time
	value   []byte
	deleted bool
}

// at returns the key as of t: the newest write not after t.
func (k *kvKey) at(t time.Time) ([]byte, bool) {
	for i := len(k.writes) - 1; i >= 0; i-- {
		if !k.writes[i].at.After(t) {
			w := k.writes[i]
			return w.value, !w.deleted
		}
	}
	return nil, false
}

func (k *kvKey) latest() ([]byte, bool) {
	if len(k.writes) == 0 {
		return nil, false
	}
	w := k.writes[len(k.writes)-1]
	return w.value, !w.deleted
}

// record appends a write and forgets the writes no read can see any more (those older than the
// newest write that is itself older than the stale window).
func (k *kvKey) record(w kvWrite, stale time.Duration) {
	k.writes = append(k.writes, w)
	horizon := w.at.Add(-stale)
	keep := 0
	for i := len(k.writes) - 1; i >= 0; i-- {
		if !k.writes[i].at.After(horizon) {
			keep = i
			break
		}
	}
	k.writes = append([]kvWrite(nil), k.writes[keep:]...)
}

const maxKVKey = 512

// KVValue reads key in namespace ns as the API sees it (the latest write).
func (s *Server) KVValue(ns, key string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.kv[ns][key]
	if k == nil {
		return nil, false
	}
	v, ok := k.latest()
	return append([]byte(nil), v...), ok
}

// EdgeKVValue reads key in namespace ns as a worker at the edge sees it: writes and deletes of
// the last KVStale are not seen yet.
func (s *Server) EdgeKVValue(ns, key string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.edgeKV(ns, key)
}

func (s *Server) edgeKV(ns, key string) ([]byte, bool) {
	k := s.kv[ns][key]
	if k == nil {
		return nil, false
	}
	v, ok := k.at(s.now().Add(-s.cfg.KVStale))
	return append([]byte(nil), v...), ok
}

// KVKeys counts the keys of namespace ns that currently hold a value (API view).
func (s *Server) KVKeys(ns string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, k := range s.kv[ns] {
		if _, ok := k.latest(); ok {
			n++
		}
	}
	return n
}

func (s *Server) kvScope(r *http.Request) (string, string, *failure) {
	ns, key := r.PathValue("namespace"), r.PathValue("key")
	s.mu.Lock()
	_, ok := s.kv[ns]
	s.mu.Unlock()
	if !ok {
		return "", "", fail(http.StatusNotFound, CodeKVNamespaceNotFound, "namespace not found")
	}
	if key == "" || len(key) > maxKVKey || key == "." || key == ".." {
		return "", "", fail(http.StatusBadRequest, CodeValidation, "Invalid key name: keys are 1 to 512 bytes and not . or ..")
	}
	return ns, key, nil
}

// putKV writes a value: the raw body, or the "value" part of a multipart body (which may carry
// "metadata", accepted and not kept).
func (s *Server) putKV(w http.ResponseWriter, r *http.Request) *failure {
	ns, key, f := s.kvScope(r)
	if f != nil {
		return f
	}
	const maxValue = 25 << 20
	var value []byte
	mediaType, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if mediaType == "multipart/form-data" {
		reader := multipart.NewReader(io.LimitReader(r.Body, maxValue+(1<<20)), params["boundary"])
		found := false
		for {
			part, err := reader.NextPart()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return fail(http.StatusBadRequest, CodeBadRequestBody, "Could not parse request body: "+err.Error())
			}
			data, err := io.ReadAll(part)
			if err != nil {
				return fail(http.StatusBadRequest, CodeBadRequestBody, "Could not parse request body: "+err.Error())
			}
			if part.FormName() == "value" {
				value, found = data, true
			}
		}
		if !found {
			return fail(http.StatusBadRequest, CodeBadRequestBody, "Could not parse request body: the value part is missing")
		}
	} else {
		data, err := io.ReadAll(io.LimitReader(r.Body, maxValue+1))
		if err != nil {
			return fail(http.StatusBadRequest, CodeBadRequestBody, "Could not parse request body: "+err.Error())
		}
		value = data
	}
	if len(value) > maxValue {
		return fail(http.StatusRequestEntityTooLarge, CodeValidation, "Value exceeds the 25 MiB limit.")
	}
	s.mu.Lock()
	k := s.kv[ns][key]
	if k == nil {
		k = &kvKey{}
		s.kv[ns][key] = k
	}
	k.record(kvWrite{at: s.now(), value: value}, s.cfg.KVStale)
	s.mu.Unlock()
	writeResult(w, map[string]any{})
	return nil
}

// getKV answers the raw value (not an envelope), or 404 with Workers KV's "key not found".
func (s *Server) getKV(w http.ResponseWriter, r *http.Request) *failure {
	ns, key, f := s.kvScope(r)
	if f != nil {
		return f
	}
	var value []byte
	var ok bool
	if s.cfg.StaleAPIReads {
		value, ok = s.EdgeKVValue(ns, key)
	} else {
		value, ok = s.KVValue(ns, key)
	}
	if !ok {
		return fail(http.StatusNotFound, CodeKVKeyNotFound, "get: 'key not found'")
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(value)
	return nil
}

// deleteKV removes a key; Cloudflare answers success whether or not it existed.
func (s *Server) deleteKV(w http.ResponseWriter, r *http.Request) *failure {
	ns, key, f := s.kvScope(r)
	if f != nil {
		return f
	}
	s.mu.Lock()
	if k := s.kv[ns][key]; k != nil {
		k.record(kvWrite{at: s.now(), deleted: true}, s.cfg.KVStale)
	}
	s.mu.Unlock()
	writeResult(w, map[string]any{})
	return nil
}
