package server_test

import (
	"sort"
	"strings"
)

// freeForm lists the request and response schemas, or schema fields,
// that are free-form by design: what each holds has no fixed shape.
var freeForm = map[string]string{
	"GET /openapi.json response":                            "this document: its shape is OpenAPI's",
	"EvaluateResult.value":                                  "a JavaScript expression's value: any JSON value",
	"GET /sandboxes/{id}/browser/cdp/json/version response": "Chromium's own DevTools discovery document, passed through with its WebSocket address rewritten",
	"GET /sandboxes/{id}/browser/network response":          "the connection log, or with ?format=har an HTTP Archive 1.2 document",
	"GET /sandboxes/{id}/network response":                  "the connection log, or with ?format=har an HTTP Archive 1.2 document",
	"StepRequest.action":                                    "an action object of the episode's kind, passed to the sandbox as sent: a BrowserAction, or a desktop action in any of its three dialects (ours, Anthropic's and OpenAI's computer use, each its own shape)",
	"StepRequest.actions[]":                                 "as StepRequest.action",
	"Step.action":                                           "a recorded step's action objects as the policy sent them (as StepRequest.action), or a list of them",
	"Step.result":                                           "a recorded step's sandbox answer as it came: a BrowserActionsResponse, a DesktopActionsResponse, or an error envelope",
	"Evaluation.details[*]":                                 "what an eval compared: its fields depend on the eval type (answer_match, url_match, dom_match, js, exec, judge)",
	"Manifest.evaluation":                                   "the Evaluation as the episode gave it: the recording format keeps it verbatim and depends on no other package of the module",
	"Setup.sandbox":                                         "a fragment of a POST /sandboxes body merged as JSON over the episode's defaults: a field's absence is meaningful, so it is no CreateSandboxRequest",
	"episodeRequestDoc.sandbox":                             "as Setup.sandbox: a POST /sandboxes fragment merged over the task's setup.sandbox",
}

// untypedSchemas returns where doc's request and response schemas hold an
// object (or any value) whose shape the document does not give.
func untypedSchemas(doc map[string]any) []string {
	components, _ := doc["components"].(map[string]any)
	schemas, _ := components["schemas"].(map[string]any)
	var found []string
	seen := map[string]bool{}
	var walk func(where string, s map[string]any)
	walk = func(where string, s map[string]any) {
		if ref, ok := s["$ref"].(string); ok {
			name := strings.TrimPrefix(ref, "#/components/schemas/")
			if seen[name] {
				return
			}
			seen[name] = true
			sch, _ := schemas[name].(map[string]any)
			walk(name, sch)
			return
		}
		for _, k := range []string{"allOf", "oneOf", "anyOf"} {
			if l, ok := s[k].([]any); ok {
				for _, e := range l {
					m, _ := e.(map[string]any)
					walk(where, m)
				}
				return
			}
		}
		switch s["type"] {
		case nil:
			found = append(found, where)
		case "object":
			props, _ := s["properties"].(map[string]any)
			add, hasAdd := s["additionalProperties"].(map[string]any)
			if len(props) == 0 && !hasAdd {
				found = append(found, where)
			}
			for name, p := range props {
				m, _ := p.(map[string]any)
				walk(strings.TrimSuffix(where, " request")+"."+name, m)
			}
			if hasAdd {
				walk(where+"[*]", add)
			}
		case "array":
			m, _ := s["items"].(map[string]any)
			walk(where+"[]", m)
		}
	}
	paths, _ := doc["paths"].(map[string]any)
	for p, item := range paths {
		ops, _ := item.(map[string]any)
		for method, op := range ops {
			o, _ := op.(map[string]any)
			at := strings.ToUpper(method) + " " + p
			if rb, ok := o["requestBody"].(map[string]any); ok {
				if s, ok := jsonSchema(rb); ok {
					check(at+" request", s, walk)
				}
			}
			responses, _ := o["responses"].(map[string]any)
			if ok200, ok := responses["200"].(map[string]any); ok {
				if s, ok := jsonSchema(ok200); ok {
					check(at+" response", s, walk)
				}
			}
		}
	}
	var out []string
	for _, w := range found {
		if freeForm[w] == "" {
			out = append(out, w)
		}
	}
	sort.Strings(out)
	return out
}

// check walks a top-level schema unless it is allowed as a whole.
func check(at string, s map[string]any, walk func(string, map[string]any)) {
	if freeForm[at] != "" {
		return
	}
	walk(at, s)
}

func jsonSchema(body map[string]any) (map[string]any, bool) {
	content, _ := body["content"].(map[string]any)
	mt, ok := content["application/json"].(map[string]any)
	if !ok {
		return nil, false
	}
	s, ok := mt["schema"].(map[string]any)
	return s, ok
}
