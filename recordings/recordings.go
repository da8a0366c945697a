// Package recordings stores trajectory recordings of RL episodes: one
// directory per episode holding a manifest, one JSON line per step and the
// step screenshots, in the versioned layout described in FORMAT.md. Writes
// are crash-safe: after a crash every step whose line reached steps.jsonl is
// readable. A Recording exports to jsonl, html, gif, parquet and mp4.
package recordings

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"io/fs"
	"mime"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/orchard/orchard/faults"
)

// Version is the on-disk layout version written to every manifest.
const Version = 1

// CodeRecordingNotFound is faults.CodeRecordingNotFound.
const CodeRecordingNotFound = faults.CodeRecordingNotFound

// File names inside a recording directory.
const (
	manifestFile = "manifest.json"
	stepsFile    = "steps.jsonl"
	imagesDir    = "images"
)

// Outcomes of a finished episode.
const (
	OutcomeSuccess  = "success"
	OutcomeFailure  = "failure"
	OutcomeEnvError = "env_error"
)

// Manifest describes one recording. It is rewritten after every step, so
// Steps is the count of steps known when it was last written.
type Manifest struct {
	Version   int    `json:"version"`
	ID        string `json:"id"`
	EpisodeID string `json:"episode_id,omitempty"`
	TaskID    string `json:"task_id,omitempty"`
	// Suite is the task suite the task was loaded from; empty for an
	// inline task.
	Suite      string     `json:"suite,omitempty"`
	Question   string     `json:"question,omitempty"`
	StartURL   string     `json:"start_url,omitempty"`
	SandboxID  string     `json:"sandbox_id,omitempty"`
	Kind       string     `json:"kind,omitempty"` // browser|desktop|shell
	CreatedAt  time.Time  `json:"created_at"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	Steps      int        `json:"steps"`
	// Outcome is success, failure or env_error; empty while running.
	Outcome         string          `json:"outcome,omitempty"`
	Reward          *float64        `json:"reward,omitempty"`
	Answer          string          `json:"answer,omitempty"`
	Attribution     *faults.Info    `json:"attribution,omitempty"`
	AttributionStep int             `json:"attribution_step,omitempty"`
	Evaluation      json.RawMessage `json:"evaluation,omitempty"`
	// Parent, on the recording of a forked episode, names the recording
	// whose steps 0..Parent.Steps-1 are this one's first: this one holds
	// only its own, from step Parent.Steps on (FORMAT.md "Branches").
	Parent *ParentRef `json:"parent,omitempty"`
}

// Step is one line of steps.jsonl: the action the policy sent and the
// observation that followed. Step 0 is the reset and has no action.
type Step struct {
	N    int       `json:"n"`
	Time time.Time `json:"time"`
	// Action is what the policy sent; its coordinates are screenshot
	// pixels of the previous step's screenshot.
	Action json.RawMessage `json:"action,omitempty"`
	// Result is the action result as returned.
	Result json.RawMessage `json:"result,omitempty"`
	URL    string          `json:"url,omitempty"`
	Title  string          `json:"title,omitempty"`
	Text   string          `json:"text,omitempty"`
	AXTree string          `json:"axtree,omitempty"`
	// Screenshot is a slash-separated path relative to the recording
	// directory, e.g. "images/000003.jpg"; empty when the step has none.
	Screenshot string        `json:"screenshot,omitempty"`
	Frame      int64         `json:"frame,omitempty"`
	Scale      float64       `json:"scale,omitempty"`
	Width      int           `json:"width,omitempty"`
	Height     int           `json:"height,omitempty"`
	StepMS     float64       `json:"step_ms,omitempty"`
	Error      *faults.Info  `json:"error,omitempty"`
	Injected   *faults.Truth `json:"injected,omitempty"`

	// dir is the recording directory Screenshot is relative to when the
	// step is a parent's in a resolved trajectory; "" is the recording's own.
	dir string
}

var idPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// ValidID reports whether id can name a recording: 1 to 64 of
// [A-Za-z0-9_-], so it is always a single path element.
func ValidID(id string) bool { return idPattern.MatchString(id) }

func invalidID(id string) error {
	return faults.Newf(faults.CodeValidation, faults.InvalidRequest, faults.Client,
		"invalid recording id %q: want 1-64 of [A-Za-z0-9_-]", id)
}

// imageTypes maps the screenshot extensions a recording accepts to their
// content types.
var imageTypes = map[string]string{
	"jpg":  "image/jpeg",
	"jpeg": "image/jpeg",
	"png":  "image/png",
	"webp": "image/webp",
}

func contentTypeOf(name string) string {
	ext := strings.TrimPrefix(strings.ToLower(path.Ext(name)), ".")
	if ct, ok := imageTypes[ext]; ok {
		return ct
	}
	if ct := mime.TypeByExtension(path.Ext(name)); ct != "" {
		return ct
	}
	return "application/octet-stream"
}

// Store keeps recordings as directories under one root.
type Store struct{ root string }

// NewStore returns a store rooted at root, creating the directory.
func NewStore(root string) (*Store, error) {
	if root == "" {
		return nil, errors.New("new recording store: empty root")
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("new recording store: %w", err)
	}
	return &Store{root: root}, nil
}

// Root is the directory holding the recordings.
func (s *Store) Root() string { return s.root }

// Create starts a recording: the directory root/<id>/ with manifest.json,
// an empty steps.jsonl and images/. An empty m.ID gets a random one;
// Version and an unset CreatedAt are filled in. An existing id is a conflict.
func (s *Store) Create(m Manifest) (*Writer, error) {
	if m.ID == "" {
		m.ID = uuid.NewString()
	}
	if !ValidID(m.ID) {
		return nil, invalidID(m.ID)
	}
	m.Version = Version
	if m.CreatedAt.IsZero() {
		m.CreatedAt = time.Now().UTC()
	}
	m.Steps = 0
	dir := filepath.Join(s.root, m.ID)
	if err := os.Mkdir(dir, 0o755); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, faults.Newf(faults.CodeValidation, faults.Conflict, faults.Client, "recording %s already exists", m.ID)
		}
		return nil, fmt.Errorf("create recording %s: %w", m.ID, err)
	}
	if err := os.Mkdir(filepath.Join(dir, imagesDir), 0o755); err != nil {
		return nil, fmt.Errorf("create recording %s: %w", m.ID, err)
	}
	f, err := os.OpenFile(filepath.Join(dir, stepsFile), os.O_CREATE|os.O_EXCL|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create recording %s: %w", m.ID, err)
	}
	w := &Writer{dir: dir, m: m, steps: f}
	// The manifest is written last: List skips directories without one, so
	// a crash here leaves no half-made recording in the listing.
	if err := writeJSONAtomic(filepath.Join(dir, manifestFile), m); err != nil {
		f.Close()
		return nil, fmt.Errorf("create recording %s: %w", m.ID, err)
	}
	if err := syncDir(dir); err != nil {
		f.Close()
		return nil, fmt.Errorf("create recording %s: %w", m.ID, err)
	}
	if err := syncDir(s.root); err != nil {
		f.Close()
		return nil, fmt.Errorf("create recording %s: %w", m.ID, err)
	}
	return w, nil
}

// Resume reopens the unfinished recording id for appending, as the next
// call of its episode may reach another server process sharing the
// directory. A torn last line (a crash mid-append) is cut off first, so the
// next step starts on a line of its own; the step count is what
// steps.jsonl holds. A finished recording is a conflict.
func (s *Store) Resume(id string) (*Writer, error) {
	dir, m, err := s.manifest(id, "resume")
	if err != nil {
		return nil, err
	}
	if m.FinishedAt != nil {
		return nil, faults.Newf(faults.CodeValidation, faults.Conflict, faults.Client, "resume recording %s: already finished", id)
	}
	name := filepath.Join(dir, stepsFile)
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("resume recording %s: %w", id, err)
	}
	if n := intactLength(b); n < len(b) {
		if err := os.Truncate(name, int64(n)); err != nil {
			return nil, fmt.Errorf("resume recording %s: cut torn line: %w", id, err)
		}
	}
	steps, err := readSteps(name)
	if err != nil {
		return nil, fmt.Errorf("resume recording %s: %w", id, err)
	}
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("resume recording %s: %w", id, err)
	}
	m.Steps = len(steps)
	return &Writer{dir: dir, m: m, steps: f}, nil
}

// Writer appends steps to one recording. It is safe for concurrent use.
type Writer struct {
	dir string

	mu       sync.Mutex // guards m, steps and finished
	m        Manifest
	steps    *os.File
	finished bool
}

// ID is the recording's id.
func (w *Writer) ID() string { return w.m.ID }

// Manifest returns the manifest as last written.
func (w *Writer) Manifest() Manifest {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.m
}

// Append records one step. A non-empty screenshot is written first to
// images/<n>.<ext> (temp file, fsync, rename) and st.Screenshot set to it;
// then the step is appended to steps.jsonl as one line and fsynced, and
// manifest.json is rewritten with the new step count. A crash at any point
// leaves every step whose line is complete readable, with its image.
func (w *Writer) Append(st Step, screenshot []byte, ext string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.finished {
		return faults.Newf(faults.CodeValidation, faults.Conflict, faults.Client, "append to recording %s: already finished", w.m.ID)
	}
	if st.N < 0 {
		return faults.Newf(faults.CodeValidation, faults.InvalidRequest, faults.Client, "append to recording %s: negative step %d", w.m.ID, st.N)
	}
	if st.Time.IsZero() {
		st.Time = time.Now().UTC()
	}
	if len(screenshot) > 0 {
		ext = strings.ToLower(strings.TrimPrefix(ext, "."))
		if _, ok := imageTypes[ext]; !ok {
			return faults.Newf(faults.CodeValidation, faults.InvalidRequest, faults.Client,
				"append to recording %s: unsupported screenshot type %q (want jpg, png or webp)", w.m.ID, ext)
		}
		rel := path.Join(imagesDir, fmt.Sprintf("%06d.%s", st.N, ext))
		if err := writeFileAtomic(filepath.Join(w.dir, filepath.FromSlash(rel)), screenshot); err != nil {
			return fmt.Errorf("append step %d to recording %s: %w", st.N, w.m.ID, err)
		}
		st.Screenshot = rel
	} else if st.Screenshot != "" && !safeRel(st.Screenshot) {
		return faults.Newf(faults.CodeValidation, faults.InvalidRequest, faults.Client,
			"append to recording %s: screenshot path %q is not inside the recording", w.m.ID, st.Screenshot)
	}
	st.Action, st.Result = validUTF8(st.Action), validUTF8(st.Result)
	line, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("append step %d to recording %s: %w", st.N, w.m.ID, err)
	}
	line = append(line, '\n')
	if _, err := w.steps.Write(line); err != nil {
		return fmt.Errorf("append step %d to recording %s: %w", st.N, w.m.ID, err)
	}
	if err := w.steps.Sync(); err != nil {
		return fmt.Errorf("append step %d to recording %s: %w", st.N, w.m.ID, err)
	}
	w.m.Steps++
	if err := writeJSONAtomic(filepath.Join(w.dir, manifestFile), w.m); err != nil {
		return fmt.Errorf("append step %d to recording %s: %w", st.N, w.m.ID, err)
	}
	return nil
}

// Finish applies update to the manifest (outcome, reward, attribution ...),
// sets FinishedAt if update left it unset, writes the manifest and closes
// the recording. Id, version and step count are not changed by update.
func (w *Writer) Finish(update func(*Manifest)) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.finished {
		return faults.Newf(faults.CodeValidation, faults.Conflict, faults.Client, "finish recording %s: already finished", w.m.ID)
	}
	m := w.m
	if update != nil {
		update(&m)
	}
	m.ID, m.Version, m.Steps = w.m.ID, w.m.Version, w.m.Steps
	m.Evaluation = validUTF8(m.Evaluation)
	if m.FinishedAt == nil {
		now := time.Now().UTC()
		m.FinishedAt = &now
	}
	if err := writeJSONAtomic(filepath.Join(w.dir, manifestFile), m); err != nil {
		return fmt.Errorf("finish recording %s: %w", w.m.ID, err)
	}
	w.m = m
	w.finished = true
	if err := w.steps.Close(); err != nil {
		return fmt.Errorf("finish recording %s: %w", w.m.ID, err)
	}
	return nil
}

// Close releases the writer without finishing the recording (an aborted
// episode); the recording stays readable with Outcome empty.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.finished {
		return nil
	}
	w.finished = true
	return w.steps.Close()
}

// List returns the manifests of all recordings, newest (CreatedAt) first.
// Directories without a readable manifest (a create cut short) are skipped.
func (s *Store) List() ([]Manifest, error) {
	entries, err := os.ReadDir(s.root)
	if err != nil {
		return nil, fmt.Errorf("list recordings: %w", err)
	}
	out := make([]Manifest, 0, len(entries))
	for _, e := range entries {
		if !e.IsDir() || !ValidID(e.Name()) {
			continue
		}
		m, err := readManifest(filepath.Join(s.root, e.Name()))
		if err != nil {
			continue
		}
		out = append(out, m)
	}
	sort.SliceStable(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.After(out[j].CreatedAt)
		}
		return out[i].ID > out[j].ID
	})
	return out, nil
}

// Recording is a recording read from disk.
type Recording struct {
	dir   string
	m     Manifest
	steps []Step
}

// Open reads the recording id. A last line of steps.jsonl that does not
// parse (a crash mid-write) is ignored; a bad line before it is an error.
// The returned manifest's Steps is the number of steps read.
func (s *Store) Open(id string) (*Recording, error) {
	dir, m, err := s.manifest(id, "open")
	if err != nil {
		return nil, err
	}
	steps, err := readSteps(filepath.Join(dir, stepsFile))
	if err != nil {
		return nil, fmt.Errorf("open recording %s: %w", id, err)
	}
	m.Steps = len(steps)
	return &Recording{dir: dir, m: m, steps: steps}, nil
}

// manifest reads the manifest of recording id, for op (the caller's verb).
func (s *Store) manifest(id, op string) (string, Manifest, error) {
	if !ValidID(id) {
		return "", Manifest{}, invalidID(id)
	}
	dir := filepath.Join(s.root, id)
	m, err := readManifest(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", m, faults.Newf(CodeRecordingNotFound, faults.NotFound, faults.Client, "recording %s not found", id)
		}
		return "", m, fmt.Errorf("%s recording %s: %w", op, id, err)
	}
	if m.Version > Version {
		return "", m, faults.Newf(faults.CodeValidation, faults.NotImplemented, faults.Platform,
			"recording %s has layout version %d; this build reads up to %d", id, m.Version, Version)
	}
	return dir, m, nil
}

// Manifest returns the recording's manifest.
func (r *Recording) Manifest() Manifest { return r.m }

// Steps returns the recorded steps in order.
func (r *Recording) Steps() []Step { return r.steps }

// Image returns the screenshot of step n and its content type.
func (r *Recording) Image(n int) ([]byte, string, error) {
	for _, st := range r.steps {
		if st.N != n {
			continue
		}
		if st.Screenshot == "" {
			return nil, "", faults.Newf(CodeRecordingNotFound, faults.NotFound, faults.Client, "recording %s step %d has no screenshot", r.m.ID, n)
		}
		b, err := r.readImage(st)
		if err != nil {
			return nil, "", err
		}
		return b, contentTypeOf(st.Screenshot), nil
	}
	return nil, "", faults.Newf(CodeRecordingNotFound, faults.NotFound, faults.Client, "recording %s has no step %d", r.m.ID, n)
}

func (r *Recording) readImage(st Step) ([]byte, error) {
	p, err := r.screenshotPath(st)
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("read screenshot of step %d of recording %s: %w", st.N, r.m.ID, err)
	}
	return b, nil
}

// screenshotPath is where a step's screenshot is, refused when the
// recording names a path outside its directory.
func (r *Recording) screenshotPath(st Step) (string, error) {
	if !safeRel(st.Screenshot) {
		return "", faults.Newf(faults.CodeInternal, faults.Internal, faults.Platform, "recording %s step %d: bad screenshot path", r.m.ID, st.N)
	}
	dir := r.dir
	if st.dir != "" {
		dir = st.dir
	}
	return filepath.Join(dir, filepath.FromSlash(st.Screenshot)), nil
}

// imageConfig reads the size of a step's screenshot from its header.
func (r *Recording) imageConfig(st Step) (image.Config, error) {
	p, err := r.screenshotPath(st)
	if err != nil {
		return image.Config{}, err
	}
	f, err := os.Open(p)
	if err != nil {
		return image.Config{}, fmt.Errorf("read screenshot of step %d of recording %s: %w", st.N, r.m.ID, err)
	}
	defer f.Close()
	cfg, _, err := image.DecodeConfig(bufio.NewReader(f))
	if err != nil {
		return image.Config{}, fmt.Errorf("decode screenshot of step %d: %w", st.N, err)
	}
	return cfg, nil
}

// safeRel reports whether p is a slash path that stays inside the
// recording directory.
func safeRel(p string) bool {
	return p != "" && !strings.Contains(p, `\`) && filepath.IsLocal(filepath.FromSlash(p))
}

// intactLength is the length of steps.jsonl content b without a torn or
// unparsable last line: what the next append may follow.
func intactLength(b []byte) int {
	n := bytes.LastIndexByte(b, '\n') + 1
	trimmed := bytes.TrimRight(b[:n], " \t\r\n")
	start := bytes.LastIndexByte(trimmed, '\n') + 1
	if last := trimmed[start:]; len(last) > 0 && !json.Valid(last) {
		return start
	}
	return n
}

func readManifest(dir string) (Manifest, error) {
	var m Manifest
	b, err := os.ReadFile(filepath.Join(dir, manifestFile))
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("parse %s: %w", manifestFile, err)
	}
	m.Evaluation = validUTF8(m.Evaluation)
	return m, nil
}

func readSteps(name string) ([]Step, error) {
	b, err := os.ReadFile(name)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	var steps []Step
	var bad error
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), len(b)+1)
	for line := 1; sc.Scan(); line++ {
		if bad != nil {
			// Only the last line may be torn.
			return nil, bad
		}
		text := bytes.TrimSpace(sc.Bytes())
		if len(text) == 0 {
			continue
		}
		var st Step
		if err := json.Unmarshal(text, &st); err != nil {
			bad = fmt.Errorf("%s line %d: %w", stepsFile, line, err)
			continue
		}
		st.Action, st.Result = validUTF8(st.Action), validUTF8(st.Result)
		steps = append(steps, st)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return steps, nil
}

// validUTF8 replaces invalid UTF-8 in raw JSON with U+FFFD, as
// json.Marshal does for strings: encoding/json accepts and passes through
// such bytes in a RawMessage, but JSON text must be UTF-8 (RFC 8259), and
// readers such as Python's json reject it. In JSON that parses, bytes
// outside ASCII only occur inside strings, so the result stays valid.
func validUTF8(raw json.RawMessage) json.RawMessage {
	if utf8.Valid(raw) {
		return raw
	}
	return bytes.ToValidUTF8(raw, []byte("\uFFFD"))
}

func writeJSONAtomic(name string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(name, append(b, '\n'))
}

// writeFileAtomic writes name through a synced temp file and a rename, so
// readers see the old content or the new, never a part.
func writeFileAtomic(name string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(name), "."+filepath.Base(name)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Chmod(tmp, 0o644); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, name); err != nil {
		os.Remove(tmp)
		return err
	}
	return syncDir(filepath.Dir(name))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
