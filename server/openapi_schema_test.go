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
}

// notYetTyped lists schemas whose types are not in api yet; each entry
// goes when its type does.
var notYetTyped = map[string]string{
	"POST /sandboxes/{id}/browser/actions request":     "the GUI step protocol (action envelope)",
	"POST /sandboxes/{id}/browser/actions response":    "the GUI step protocol (results, observation)",
	"GET /sandboxes/{id}/browser/observation response": "the GUI step protocol (observation)",
	"POST /sandboxes/{id}/desktop/actions request":     "the GUI step protocol (action envelope)",
	"POST /sandboxes/{id}/desktop/actions response":    "the GUI step protocol (results, observation)",
	"GET /sandboxes/{id}/desktop/status response":      "the desktop's status and last fault",
}

// typedElsewhere are path prefixes whose bodies are typed with the
// episode engine's own types, checked with it.
var typedElsewhere = []string{"/episodes", "/tasks", "/recordings"}

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
		skip := false
		for _, pre := range typedElsewhere {
			skip = skip || strings.HasPrefix(p, pre)
		}
		if skip {
			continue
		}
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
		if freeForm[w] == "" && notYetTyped[w] == "" {
			out = append(out, w)
		}
	}
	sort.Strings(out)
	return out
}

// check walks a top-level schema unless it is allowed as a whole.
func check(at string, s map[string]any, walk func(string, map[string]any)) {
	if freeForm[at] != "" || notYetTyped[at] != "" {
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
