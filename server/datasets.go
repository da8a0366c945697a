package server

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"

	"github.com/gin-gonic/gin"

	"github.com/orchard/orchard/dataset"
	"github.com/orchard/orchard/faults"
)

// maxDatasetRequest bounds a POST /datasets body: a selection and a few
// options, far below the server's limit for uploads.
const maxDatasetRequest = 1 << 20

// datasetRequest is the body of POST /datasets.
type datasetRequest struct {
	dataset.Options
	// Layout, besides gui and shell, may be "mind2web": Online-Mind2Web's
	// evaluation layout (a folder per task), for its WebJudge scripts.
}

func (s *Server) datasetRoutes() []route {
	return []route{
		{method: "POST", path: "/datasets", summary: "Build recordings into a dataset and answer it as a tar: layout gui or shell (Parquet shards, dataset card, manifest.json; datasets.load_dataset opens the unpacked folder) or mind2web (Online-Mind2Web's evaluation layout); env_error episodes are left out unless asked for",
			request: datasetRequest{}, produces: "application/x-tar", stream: true, handler: s.buildDataset},
	}
}

// buildDataset builds into a temporary folder, then streams it as a tar:
// the build reads one recording at a time, and the tar is written file by
// file, so neither holds the dataset in memory.
func (s *Server) buildDataset(c *gin.Context) error {
	// The body is read here (a stream route) so that its own bound, not
	// the upload limit, applies.
	raw, err := io.ReadAll(http.MaxBytesReader(c.Writer, c.Request.Body, maxDatasetRequest))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return faults.Newf(faults.CodeTooLarge, faults.TooLarge, faults.Client, "dataset request exceeds %d bytes", maxDatasetRequest)
		}
		return faults.Wrap(err, faults.CodeInvalidJSON, faults.InvalidRequest, faults.Client, "could not read request body")
	}
	var req datasetRequest
	if len(bytes.TrimSpace(raw)) > 0 {
		if err := decodeJSON(raw, &req); err != nil {
			return err
		}
	}
	st, err := s.recStore()
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "orchard-dataset-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	dir := filepath.Join(tmp, "dataset")
	ctx := c.Request.Context()
	if req.Layout == dataset.LayoutMind2Web {
		_, err = dataset.ExportMind2Web(ctx, st, dir, req.Selection)
	} else {
		_, err = dataset.Build(ctx, st, dir, req.Options)
	}
	if err != nil {
		return err
	}
	c.Header("Content-Type", "application/x-tar")
	c.Status(http.StatusOK)
	if err := tarDir(dir, c.Writer); err != nil {
		// Too late for an error body: break the connection so that the
		// client sees a failed transfer, not a short archive.
		s.log.Warn("dataset transfer aborted", "err", err)
		panic(http.ErrAbortHandler)
	}
	return nil
}
