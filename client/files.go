package client

import (
	"context"
	"encoding/base64"
	"fmt"
	"io/fs"
	"math"
	"net/http"
	"net/url"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
)

// Upload writes data to path in the sandbox, creating parent directories
// and replacing an existing file. Use absolute paths: a relative one
// resolves against the agent's working directory. Upload is not retried.
func (c *Client) Upload(ctx context.Context, id, path string, data []byte) (api.UploadResult, error) {
	return c.upload(ctx, id, path, data, "")
}

// UploadMode is Upload that also sets the file's permission bits (and
// setuid, setgid, sticky), as a local copy keeps them. Servers that know no
// mode (Orchard Env's) ignore it.
func (c *Client) UploadMode(ctx context.Context, id, path string, data []byte, mode fs.FileMode) (api.UploadResult, error) {
	bits := uint32(mode.Perm())
	if mode&fs.ModeSetuid != 0 {
		bits |= 0o4000
	}
	if mode&fs.ModeSetgid != 0 {
		bits |= 0o2000
	}
	if mode&fs.ModeSticky != 0 {
		bits |= 0o1000
	}
	return c.upload(ctx, id, path, data, fmt.Sprintf("%04o", bits))
}

func (c *Client) upload(ctx context.Context, id, path string, data []byte, mode string) (api.UploadResult, error) {
	content := base64.StdEncoding.EncodeToString(data)
	var out api.UploadResult
	err := c.do(ctx, call{method: http.MethodPost, path: sandboxPath(id) + "/files",
		body: api.UploadRequest{Path: &path, Content: &content, Mode: mode}, out: &out})
	return out, err
}

// Download returns the content of the file at path in the sandbox. A
// missing file is an error with code file.not_found (not_found category).
func (c *Client) Download(ctx context.Context, id, path string) ([]byte, error) {
	var out api.FileContent
	err := c.do(ctx, call{method: http.MethodGet, path: sandboxPath(id) + "/files",
		query: url.Values{"path": {path}}, out: &out, idempotent: true})
	if err != nil {
		return nil, err
	}
	data, err := base64.StdEncoding.DecodeString(out.Content)
	if err != nil {
		return nil, faults.Wrap(err, faults.CodeBadResponse, faults.Internal, faults.Platform,
			"download "+path+": content is not base64")
	}
	return data, nil
}

// ListFiles lists the direct children of the directory at path, sorted by
// name. An empty path lists the server's working directory (/workspace).
func (c *Client) ListFiles(ctx context.Context, id, path string) (api.FileList, error) {
	var q url.Values
	if path != "" {
		q = url.Values{"path": {path}}
	}
	var out api.FileList
	err := c.do(ctx, call{method: http.MethodGet, path: sandboxPath(id) + "/files/list", query: q, out: &out, idempotent: true})
	return out, err
}

// ApplyPatch applies a unified diff in the sandbox's /workspace with git
// apply semantics (-p1, all or nothing). A patch that does not apply is a
// result with Success false, not an error. timeout is rounded up to whole
// seconds; zero or less means the server's default (30 s). ApplyPatch is
// not retried.
func (c *Client) ApplyPatch(ctx context.Context, id, patch string, timeout time.Duration) (api.PatchResult, error) {
	req := api.PatchRequest{Patch: &patch}
	poll := 30 * time.Second
	if timeout > 0 {
		secs := int(math.Ceil(timeout.Seconds()))
		req.TimeoutSeconds = &secs
		poll = time.Duration(secs) * time.Second
	}
	var out api.PatchResult
	err := c.do(ctx, call{method: http.MethodPost, path: sandboxPath(id) + "/apply_patch", body: req, out: &out, longPoll: poll})
	return out, err
}
