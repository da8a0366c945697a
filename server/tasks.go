package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/recordings"
	"github.com/orchard/orchard/tasks"
)

// Suites loaded with POST /tasks are kept in the store too, so that every
// replica knows them; each replica's registry follows the store. A suite's
// hash is a document of its own, so the check made before each episode
// reads a few bytes per suite, and a suite only when it changed.
const (
	suiteDoc    = "task-suite"
	suiteSumDoc = "task-suite-sum"
)

// syncSuites loads into the registry the suites of the store that it does
// not have in their stored version.
func (s *Server) syncSuites(ctx context.Context) error {
	sums, err := s.eps.Docs().ListDocs(ctx, suiteSumDoc)
	if err != nil {
		return err
	}
	s.suitesMu.Lock()
	defer s.suitesMu.Unlock()
	for name, sum := range sums {
		if s.suiteSums[name] == string(sum) {
			continue
		}
		b, ok, err := s.eps.Docs().GetDoc(ctx, suiteDoc, name)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		var list []tasks.Task
		if err := json.Unmarshal(b, &list); err != nil {
			s.log.Warn("tasks: stored suite does not decode", "suite", name, "err", err)
			continue
		}
		if err := s.tasks.Add(name, list); err != nil {
			s.log.Warn("tasks: stored suite does not load", "suite", name, "err", err)
			continue
		}
		s.suiteSums[name] = string(sum)
	}
	return nil
}

// The bodies of /tasks and /recordings. Their elements are the task
// format (tasks.Task) and the recording format (recordings.Manifest,
// recordings.Step, recordings/FORMAT.md), which package api does not
// depend on; the server, which renders them, names the envelopes.
type (
	// suiteList is the answer of GET /tasks.
	suiteList struct {
		Suites []tasks.SuiteInfo `json:"suites"`
	}
	// suiteTasks is the answer of GET /tasks/{suite}.
	suiteTasks struct {
		Suite string       `json:"suite"`
		Tasks []tasks.Task `json:"tasks"`
	}
	// suiteLoaded is the answer of POST /tasks: the suite and its number
	// of tasks.
	suiteLoaded struct {
		Suite string `json:"suite"`
		Tasks int    `json:"tasks"`
	}
	// recordingList is the answer of GET /recordings, newest first.
	recordingList struct {
		Recordings []recordings.Manifest `json:"recordings"`
	}
	// recordingDoc is the answer of GET /recordings/{id}.
	recordingDoc struct {
		Manifest recordings.Manifest `json:"manifest"`
		Steps    []recordings.Step   `json:"steps"`
	}
)

func (s *Server) listTasks(c *gin.Context) error {
	if err := s.syncSuites(c.Request.Context()); err != nil {
		return err
	}
	c.JSON(http.StatusOK, suiteList{Suites: s.tasks.List()})
	return nil
}

func (s *Server) suiteTasks(c *gin.Context) error {
	if err := s.syncSuites(c.Request.Context()); err != nil {
		return err
	}
	c.JSON(http.StatusOK, suiteTasks{Suite: c.Param("suite"), Tasks: s.tasks.Tasks(c.Param("suite"))})
	return nil
}

func (s *Server) loadTasks(c *gin.Context) error {
	suite := c.Query("suite")
	if suite == "" {
		return faults.Validation(faults.FieldError{Type: "missing", Loc: []any{"query", "suite"}, Msg: "Field required", Input: nil})
	}
	name := c.Query("name")
	if name == "" {
		name = suite + ".jsonl"
	}
	list, err := tasks.Parse(bytes.NewReader(body(c)), name)
	if err != nil {
		return err
	}
	if err := s.tasks.Add(suite, list); err != nil {
		return err
	}
	b, err := json.Marshal(s.tasks.Tasks(suite))
	if err != nil {
		return err
	}
	sum := sha256.Sum256(b)
	hexSum := hex.EncodeToString(sum[:])
	// The suite before its hash: a replica that sees the new hash finds
	// the new suite.
	if err := s.eps.Docs().PutDoc(c.Request.Context(), suiteDoc, suite, b, 0); err != nil {
		return err
	}
	if err := s.eps.Docs().PutDoc(c.Request.Context(), suiteSumDoc, suite, []byte(hexSum), 0); err != nil {
		return err
	}
	s.suitesMu.Lock()
	s.suiteSums[suite] = hexSum
	s.suitesMu.Unlock()
	c.JSON(http.StatusOK, suiteLoaded{Suite: suite, Tasks: len(list)})
	return nil
}

func (s *Server) recStore() (*recordings.Store, error) {
	if s.recs == nil {
		return nil, faults.New(faults.CodeKindUnsupported, faults.NotImplemented, faults.Platform, "this server keeps no recordings")
	}
	return s.recs, nil
}

func (s *Server) openRecording(id string) (*recordings.Recording, error) {
	st, err := s.recStore()
	if err != nil {
		return nil, err
	}
	return st.Open(id)
}

// openResolved reads recording id with its whole trajectory: a branch's
// parent's first steps before its own.
func (s *Server) openResolved(id string) (*recordings.Recording, error) {
	st, err := s.recStore()
	if err != nil {
		return nil, err
	}
	return st.OpenResolved(id)
}

func (s *Server) listRecordings(c *gin.Context) error {
	st, err := s.recStore()
	if err != nil {
		return err
	}
	list, err := st.List()
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, recordingList{Recordings: list})
	return nil
}

func (s *Server) getRecording(c *gin.Context) error {
	r, err := s.openRecording(c.Param("id"))
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, recordingDoc{Manifest: r.Manifest(), Steps: r.Steps()})
	return nil
}

func (s *Server) recordingScreenshot(c *gin.Context) error {
	r, err := s.openResolved(c.Param("id"))
	if err != nil {
		return err
	}
	var n int
	if _, err := fmt.Sscanf(c.Param("n"), "%d", &n); err != nil {
		return faults.Newf(faults.CodeValidation, faults.InvalidRequest, faults.Client, "step %q is not a number", c.Param("n"))
	}
	img, ct, err := r.Image(n)
	if err != nil {
		return err
	}
	c.Data(http.StatusOK, ct, img)
	return nil
}

func (s *Server) exportRecording(c *gin.Context) error {
	r, err := s.openResolved(c.Param("id"))
	if err != nil {
		return err
	}
	format := c.Query("format")
	ct, err := recordings.ContentType(format)
	if err != nil {
		return err
	}
	// Written as it is made: a long recording's screenshots, inlined in
	// the jsonl or HTML export, never sit in memory whole. An error before
	// the first byte is answered as an error.
	w := &lazyResponse{c: c, contentType: ct}
	if _, err := r.Export(c.Request.Context(), format, w); err != nil {
		if !w.started {
			return err
		}
		// Too late for an error body: break the connection so that the
		// client sees a failed transfer, not a short file.
		s.log.Warn("recording export aborted", "recording_id", c.Param("id"), "format", format, "err", err)
		panic(http.ErrAbortHandler)
	}
	if !w.started {
		w.start() // an empty export
	}
	return nil
}

// lazyResponse answers 200 with its content type at the first write.
type lazyResponse struct {
	c           *gin.Context
	contentType string
	started     bool
}

func (w *lazyResponse) start() {
	w.started = true
	w.c.Header("Content-Type", w.contentType)
	w.c.Status(http.StatusOK)
	w.c.Writer.WriteHeaderNow()
}

func (w *lazyResponse) Write(p []byte) (int, error) {
	if !w.started {
		w.start()
	}
	return w.c.Writer.Write(p)
}
