package client

import (
	"context"
	"net/http"
	"time"
)

// datasetBuildBudget is what a dataset build may take on the server on top
// of the attempt timeout: a build reads every selected recording before
// the first byte of its answer.
const datasetBuildBudget = 30 * time.Minute

// BuildDataset posts req, the body of POST /datasets (layout, select,
// splits, name, shard_bytes), and returns the built dataset as a tar. A
// build is not retried: it may have read thousands of recordings.
func (c *Client) BuildDataset(ctx context.Context, req any) ([]byte, error) {
	var out []byte
	err := c.do(ctx, call{method: http.MethodPost, path: "/datasets", body: req, rawOut: &out, longPoll: datasetBuildBudget})
	return out, err
}
