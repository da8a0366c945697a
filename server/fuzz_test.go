package server

import (
	"encoding/json"
	"testing"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
)

// FuzzDecodeRequests feeds arbitrary bodies to the request decoder of
// every JSON endpoint: it must never panic, and every refusal must be a
// classified 422 carrying FastAPI's detail list.
func FuzzDecodeRequests(f *testing.F) {
	for _, seed := range []string{
		`{"image":"host","block_network":true,"sandbox_id":"ab","cpu":"2","memory":"1Gi","timeout":30}`,
		`{"command":["echo","a"],"timeout_seconds":5,"env":{"A":"b"},"wait":true}`,
		`{"command":5}`, `{"patch":"--- a\n+++ b\n"}`, `{"path":"/x","content":"aGk="}`,
		`[]`, `null`, `"s"`, `{"env":{"A":1}}`, `{"timeout":1.5}`, ``, `{"labels":{"a":"b"},"ttl_seconds":-1}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		targets := []any{&api.CreateSandboxRequest{}, &api.ExecRequest{}, &api.PatchRequest{}, &api.UploadRequest{}}
		for _, v := range targets {
			err := decodeJSON(body, v)
			if err == nil {
				if !json.Valid(body) {
					t.Fatalf("accepted invalid JSON %q", body)
				}
				continue
			}
			fe := faults.Of(err)
			if statusOf(fe) != 422 || fe.Category != faults.InvalidRequest {
				t.Fatalf("refusal of %q is %d %s", body, statusOf(fe), fe.Category)
			}
			if _, ok := fe.Detail.([]faults.FieldError); !ok {
				t.Fatalf("refusal of %q lacks the detail list: %#v", body, fe.Detail)
			}
			if _, err := json.Marshal(faults.EnvelopeOf(fe)); err != nil {
				t.Fatalf("envelope of %q does not marshal: %v", body, err)
			}
		}
	})
}
