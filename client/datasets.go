package client

import (
	"context"
	"io"
	"net/http"
	"time"
)

// datasetBuildBudget is what a dataset build may take on the server on top
// of the attempt timeout: a build reads every selected recording before
// the first byte of its answer.
const datasetBuildBudget = 30 * time.Minute

// BuildDataset posts req, the body of POST /datasets (layout, select,
// splits, name, shard_bytes), and copies the built dataset, a tar, to w as
// it arrives: a dataset may be larger than memory. A build is not
// retried: it may have read thousands of recordings.
func (c *Client) BuildDataset(ctx context.Context, req any, w io.Writer) error {
	return c.do(ctx, call{method: http.MethodPost, path: "/datasets", body: req, stream: w, longPoll: datasetBuildBudget})
}
