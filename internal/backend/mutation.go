package backend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sync"

	"github.com/google/uuid"

	"github.com/takoform/terraform-provider-takoform/internal/canonjson"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/safedir"
	"github.com/takoform/terraform-provider-takoform/internal/sealing"
)

// ErrNotImplemented is returned by a pack whose mutation path is not built yet. It is never
// papered over with a pretend success.
var ErrNotImplemented = errors.New("this backend pack's mutation path is not implemented yet")

// Native kinds a backend holds.
const (
	NativeWorker = "worker"
	NativeRoute  = "endpoint"
)

// Bundle is a worker's code as the backend receives it.
type Bundle struct {
	Modules           map[string]string `json:"modules"`
	MainModule        string            `json:"mainModule"`
	CompatibilityDate string            `json:"compatibilityDate"`
}

// Desired is one native object the backend must hold: a worker script or an endpoint route.
type Desired struct {
	Kind         string    `json:"kind"`
	NativeName   string    `json:"nativeName"`
	DeploymentID uuid.UUID `json:"deploymentId"`
	ResourceUID  uuid.UUID `json:"resourceUid"`
	Generation   int64     `json:"generation"`
	// Worker: the bundle. Endpoint: the script the route sends to, and the public origin.
	Bundle          *Bundle `json:"bundle,omitempty"`
	ScriptName      string  `json:"scriptName,omitempty"`
	CanonicalOrigin string  `json:"canonicalOrigin,omitempty"`
}

// Observation is what the backend reports of one native object.
type Observation struct {
	Present      bool
	DeploymentID uuid.UUID
	Generation   int64
}

// Mutator changes and observes native objects on one installation.
type Mutator interface {
	// Apply makes the native object hold d, replacing any earlier generation.
	Apply(ctx context.Context, d Desired) error
	// Delete removes the native object only while it still holds what deployment wrote
	// (compare-and-delete), so that a late delete never removes its successor; deleting an absent
	// object, or one a later deployment rewrote, succeeds without touching it.
	Delete(ctx context.Context, kind, nativeName string, deployment uuid.UUID) error
	// Observe reads the native object back.
	Observe(ctx context.Context, kind, nativeName string) (Observation, error)
}

// Registry hands out the mutator of each installation.
type Registry struct {
	// StateDir is the Host's private state directory; selfhost desired state lives below it
	// unless the installation names its own runtimeDir.
	StateDir string
	// Wrap, when set, wraps every mutator handed out (tests hold or fail backend calls with it).
	Wrap func(Mutator) Mutator
	mu   sync.Mutex
	made map[string]Mutator
}

// Mutator returns the mutator of inst.
func (r *Registry) Mutator(inst catalog.Installation) (Mutator, error) {
	if inst.Pack != catalog.PackSelfhost {
		return nil, fmt.Errorf("%w (pack %s)", ErrNotImplemented, inst.Pack)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if m, ok := r.made[inst.Name]; ok {
		return m, nil
	}
	dir := inst.RuntimeDir
	if dir == "" {
		if r.StateDir == "" {
			return nil, errors.New("selfhost backend: no state directory configured")
		}
		dir = filepath.Join(r.StateDir, "runtime", inst.Name)
	}
	var m Mutator = &selfhostDesiredState{dir: dir}
	if r.Wrap != nil {
		m = r.Wrap(m)
	}
	if r.made == nil {
		r.made = map[string]Mutator{}
	}
	r.made[inst.Name] = m
	return m, nil
}

// selfhostDesiredState is the selfhost backend's mutation seam: it writes the runtime's desired
// state (bundles and routes) as private files and reads them back. It does not serve requests;
// the runtime that serves them reads this state.
type selfhostDesiredState struct {
	dir string
	mu  sync.Mutex
}

var nativeNameShape = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{0,252}$`)

func (s *selfhostDesiredState) kindDir(kind string) (string, error) {
	if kind != NativeWorker && kind != NativeRoute {
		return "", fmt.Errorf("selfhost backend: unknown native kind %q", kind)
	}
	if err := safedir.Ensure(s.dir, safedir.Current()); err != nil {
		return "", err
	}
	dir := filepath.Join(s.dir, kind+"s")
	if err := safedir.Ensure(dir, safedir.Current()); err != nil {
		return "", err
	}
	return dir, nil
}

func (s *selfhostDesiredState) Apply(_ context.Context, d Desired) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !nativeNameShape.MatchString(d.NativeName) {
		return fmt.Errorf("selfhost backend: native name %q is not safe as a file name", d.NativeName)
	}
	dir, err := s.kindDir(d.Kind)
	if err != nil {
		return err
	}
	raw, err := json.Marshal(d)
	if err != nil {
		return err
	}
	return safedir.WriteFile(dir, d.NativeName+".json", raw, safedir.Current())
}

func (s *selfhostDesiredState) Delete(ctx context.Context, kind, nativeName string, deployment uuid.UUID) error {
	if !nativeNameShape.MatchString(nativeName) {
		return fmt.Errorf("selfhost backend: native name %q is not safe as a file name", nativeName)
	}
	dir, err := s.kindDir(kind)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	obs, err := s.observe(kind, nativeName)
	if err != nil || !obs.Present || obs.DeploymentID != deployment {
		return err // absent, or rewritten by a later deployment: not ours to remove
	}
	err = os.Remove(filepath.Join(dir, nativeName+".json"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if kind == NativeWorker {
		// A deleted worker's runtime inputs go with it.
		secrets, err := s.secretsDir()
		if err != nil {
			return err
		}
		if err := os.Remove(filepath.Join(secrets, nativeName+".json")); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

func (s *selfhostDesiredState) Observe(_ context.Context, kind, nativeName string) (Observation, error) {
	return s.observe(kind, nativeName)
}

func (s *selfhostDesiredState) observe(kind, nativeName string) (Observation, error) {
	if !nativeNameShape.MatchString(nativeName) {
		return Observation{}, fmt.Errorf("selfhost backend: native name %q is not safe as a file name", nativeName)
	}
	dir, err := s.kindDir(kind)
	if err != nil {
		return Observation{}, err
	}
	raw, err := safedir.ReadFile(dir, nativeName+".json", safedir.Current())
	if errors.Is(err, fs.ErrNotExist) {
		return Observation{}, nil
	}
	if err != nil {
		return Observation{}, err
	}
	var d Desired
	if err := json.Unmarshal(raw, &d); err != nil {
		return Observation{}, fmt.Errorf("selfhost backend: unreadable desired state for %s: %w", nativeName, err)
	}
	return Observation{Present: true, DeploymentID: d.DeploymentID, Generation: d.Generation}, nil
}

// SecretSink delivers runtime-input values to where a worker runs, and answers the readback
// challenge over what the runtime was actually given (SPEC 3.5). It is the only value-bearing seam
// from the Host to a backend, and no value ever comes back through it.
type SecretSink interface {
	// DeliverSecrets gives the values to the worker scriptName (worker UID workerUID), replacing
	// any earlier delivery.
	DeliverSecrets(ctx context.Context, scriptName string, workerUID uuid.UUID, values map[string]sealing.Secret) error
	// ReadbackSecrets answers HMAC-SHA256(challenge, canonical JSON of the bindings as held) for
	// scriptName, and false when nothing is held.
	ReadbackSecrets(ctx context.Context, scriptName string, challenge []byte) ([]byte, bool, error)
}

// SecretSink returns the secret sink of inst.
func (r *Registry) SecretSink(inst catalog.Installation) (SecretSink, error) {
	m, err := r.Mutator(inst)
	if err != nil {
		return nil, err
	}
	sink, ok := m.(SecretSink)
	for u, wrapped := m.(interface{ Unwrap() Mutator }); !ok && wrapped; u, wrapped = u.Unwrap().(interface{ Unwrap() Mutator }) {
		sink, ok = u.Unwrap().(SecretSink)
	}
	if !ok {
		return nil, fmt.Errorf("%w (pack %s cannot receive runtime inputs)", ErrNotImplemented, inst.Pack)
	}
	return sink, nil
}

// DeliverSecrets writes the values into the runtime's private configuration (a 0600 file in a
// 0700 directory, SPEC 6.3). They never pass through PostgreSQL.
func (s *selfhostDesiredState) DeliverSecrets(_ context.Context, scriptName string, _ uuid.UUID, values map[string]sealing.Secret) error {
	if !nativeNameShape.MatchString(scriptName) {
		return fmt.Errorf("selfhost backend: native name %q is not safe as a file name", scriptName)
	}
	dir, err := s.secretsDir()
	if err != nil {
		return err
	}
	plain := make(map[string]string, len(values))
	for k, v := range values {
		plain[k] = v.Reveal()
	}
	raw, err := json.Marshal(map[string]any{"bindings": plain})
	if err != nil {
		return err
	}
	return safedir.WriteFile(dir, scriptName+".json", raw, safedir.Current())
}

// ReadbackSecrets answers the challenge over what DeliverSecrets wrote.
func (s *selfhostDesiredState) ReadbackSecrets(_ context.Context, scriptName string, challenge []byte) ([]byte, bool, error) {
	if !nativeNameShape.MatchString(scriptName) {
		return nil, false, fmt.Errorf("selfhost backend: native name %q is not safe as a file name", scriptName)
	}
	dir, err := s.secretsDir()
	if err != nil {
		return nil, false, err
	}
	raw, err := safedir.ReadFile(dir, scriptName+".json", safedir.Current())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	var f struct {
		Bindings map[string]string `json:"bindings"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, false, fmt.Errorf("selfhost backend: unreadable runtime inputs for %s", scriptName)
	}
	return sealing.Digest(challenge, canonjson.Marshal(f.Bindings)), true, nil
}

func (s *selfhostDesiredState) secretsDir() (string, error) {
	if err := safedir.Ensure(s.dir, safedir.Current()); err != nil {
		return "", err
	}
	dir := filepath.Join(s.dir, "secrets")
	if err := safedir.Ensure(dir, safedir.Current()); err != nil {
		return "", err
	}
	return dir, nil
}
