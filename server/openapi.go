package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/server/manager"
)

var ginParam = regexp.MustCompile(`[:*]([a-zA-Z_]+)`)

// openAPIPath turns gin's "/sandboxes/:id" into "/sandboxes/{id}" (and a
// catch-all "/s/:token/*path" into "/s/{token}/{path}", path holding the
// rest of the URL).
func openAPIPath(p string) string { return ginParam.ReplaceAllString(p, "{$1}") }

// OpenAPI builds the OpenAPI 3 document from the route table.
func (s *Server) OpenAPI() map[string]any {
	schemas := map[string]any{}
	paths := map[string]any{}
	errorRef := map[string]any{"$ref": "#/components/schemas/Error"}
	schemas["Error"] = map[string]any{
		"type": "object",
		"properties": map[string]any{
			"detail": map[string]any{"description": "a message, or FastAPI's list of validation errors"},
			"error": map[string]any{"type": "object", "properties": map[string]any{
				"category": map[string]any{"type": "string"}, "source": map[string]any{"type": "string"},
				"code": map[string]any{"type": "string"}, "message": map[string]any{"type": "string"},
				"retryable": map[string]any{"type": "boolean"},
			}},
		},
	}
	for _, r := range s.routes {
		p := openAPIPath(r.path)
		item, _ := paths[p].(map[string]any)
		if item == nil {
			item = map[string]any{}
			paths[p] = item
		}
		op := map[string]any{"summary": r.summary, "operationId": operationID(r.method, r.path)}
		var params []any
		for _, m := range ginParam.FindAllStringSubmatch(r.path, -1) {
			params = append(params, map[string]any{"name": m[1], "in": "path", "required": true, "schema": map[string]any{"type": "string"}})
		}
		for _, q := range r.query {
			sch := map[string]any{"type": q.typ}
			if m, ok := r.queryMin[q.name]; ok {
				sch["minimum"] = m
			}
			params = append(params, map[string]any{"name": q.name, "in": "query", "required": q.required,
				"description": q.doc, "schema": sch})
		}
		if params != nil {
			op["parameters"] = params
		}
		if r.request != nil {
			op["requestBody"] = map[string]any{"required": true, "content": map[string]any{
				"application/json": map[string]any{"schema": schemaOf(reflect.TypeOf(r.request), schemas)}}}
		}
		responses := map[string]any{
			"default": map[string]any{"description": "error", "content": map[string]any{"application/json": map[string]any{"schema": errorRef}}},
		}
		if r.ws {
			responses["101"] = map[string]any{"description": "WebSocket upgrade"}
		} else if r.produces != "" {
			responses["200"] = map[string]any{"description": "OK", "content": map[string]any{r.produces: map[string]any{"schema": map[string]any{"type": "string"}}}}
		} else {
			var sch any = map[string]any{"type": "object"}
			if r.response != nil {
				sch = schemaOf(reflect.TypeOf(r.response), schemas)
			}
			responses["200"] = map[string]any{"description": "OK", "content": map[string]any{"application/json": map[string]any{"schema": sch}}}
		}
		op["responses"] = responses
		if !r.public {
			op["security"] = []any{map[string]any{"APIKey": []any{}}}
		}
		item[strings.ToLower(r.method)] = op
	}
	describeLimits(schemas, s.mgr.Limits())
	describeGUIActions(schemas)
	return map[string]any{
		"openapi": "3.0.3",
		"info":    map[string]any{"title": "Orchard", "version": Version},
		"paths":   paths,
		"components": map[string]any{
			"schemas":         schemas,
			"securitySchemes": map[string]any{"APIKey": map[string]any{"type": "apiKey", "in": "header", "name": "X-API-Key"}},
		},
	}
}

func operationID(method, path string) string {
	var b strings.Builder
	b.WriteString(strings.ToLower(method))
	for _, part := range strings.Split(path, "/") {
		part = strings.TrimPrefix(part, ":")
		if part == "" {
			continue
		}
		b.WriteString("_")
		b.WriteString(strings.NewReplacer(".", "_", "-", "_").Replace(part))
	}
	return b.String()
}

// rawJSON is json.RawMessage: any JSON value, not base64 bytes.
var rawJSON = reflect.TypeFor[json.RawMessage]()

// timeType is time.Time, which JSON carries as an RFC 3339 string.
var timeType = reflect.TypeFor[time.Time]()

// stepObservationType is api.StepObservation, whose JSON is a browser's,
// a desktop's or a shell's observation (its MarshalJSON), not its Go
// fields.
var stepObservationType = reflect.TypeFor[api.StepObservation]()

// schemaOf describes t, registering named structs under components.
func schemaOf(t reflect.Type, schemas map[string]any) map[string]any {
	nullable := false
	for t.Kind() == reflect.Pointer {
		t, nullable = t.Elem(), true
	}
	var s map[string]any
	switch {
	case t == timeType:
		s = map[string]any{"type": "string", "format": "date-time"}
	case t == rawJSON:
		// Free-form by design; the field's doc says what it holds.
		s = map[string]any{}
	case t == stepObservationType:
		return map[string]any{"nullable": true, "oneOf": []any{
			schemaOf(reflect.TypeFor[api.BrowserObservation](), schemas),
			schemaOf(reflect.TypeFor[api.DesktopObservation](), schemas),
			schemaOf(reflect.TypeFor[api.ShellObservation](), schemas)}}
	case t.Name() == "Command" && t.Kind() == reflect.String, t.Name() == "HarnessList":
		s = map[string]any{"oneOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "array", "items": map[string]any{"type": "string"}}}}
	case t.Kind() == reflect.Struct:
		name := t.Name()
		if _, ok := schemas[name]; !ok {
			schemas[name] = map[string]any{} // breaks cycles
			props := map[string]any{}
			structProps(t, schemas, props)
			schemas[name] = map[string]any{"type": "object", "properties": props}
		}
		s = map[string]any{"$ref": "#/components/schemas/" + name}
		if nullable {
			s = map[string]any{"allOf": []any{s}, "nullable": true}
		}
		return s
	case t.Kind() == reflect.Map:
		s = map[string]any{"type": "object", "additionalProperties": schemaOf(t.Elem(), schemas)}
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Uint8:
		s = map[string]any{"type": "string", "format": "byte"}
	case t.Kind() == reflect.Slice:
		s = map[string]any{"type": "array", "items": schemaOf(t.Elem(), schemas)}
	case t.Kind() == reflect.Array:
		s = map[string]any{"type": "array", "items": schemaOf(t.Elem(), schemas), "minItems": t.Len(), "maxItems": t.Len()}
	case t.Kind() == reflect.String:
		s = map[string]any{"type": "string"}
	case t.Kind() == reflect.Bool:
		s = map[string]any{"type": "boolean"}
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64:
		s = map[string]any{"type": "integer"}
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		s = map[string]any{"type": "number"}
	default:
		s = map[string]any{}
	}
	if nullable {
		s["nullable"] = true
	}
	return s
}

// structProps adds the properties of struct t to props. The fields of an
// embedded struct are its own, as encoding/json flattens them; a field of
// t's own takes the place of an embedded one of the same name.
func structProps(t reflect.Type, schemas, props map[string]any) {
	own := map[string]bool{}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := strings.Split(f.Tag.Get("json"), ",")[0]
		if f.Anonymous && f.Type.Kind() == reflect.Struct && tag == "" {
			inner := map[string]any{}
			structProps(f.Type, schemas, inner)
			for k, v := range inner {
				if !own[k] {
					props[k] = v
				}
			}
			continue
		}
		if !f.IsExported() || tag == "-" {
			continue
		}
		if tag == "" {
			tag = f.Name
		}
		props[tag], own[tag] = fieldSchema(f, schemas), true
	}
}

// fieldSchema describes a struct field: its type's schema with the bounds
// of its `openapi` tag ("minimum=0,maximum=10") and the text of its `doc`
// tag. The handlers enforce the same bounds (validate.go).
func fieldSchema(f reflect.StructField, schemas map[string]any) map[string]any {
	s := schemaOf(f.Type, schemas)
	tag, doc := f.Tag.Get("openapi"), f.Tag.Get("doc")
	if tag == "" && doc == "" {
		return s
	}
	if _, ref := s["$ref"]; ref {
		return s // a $ref takes no siblings in OpenAPI 3.0
	}
	for _, kv := range strings.Split(tag, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			continue
		}
		n, err := strconv.ParseFloat(v, 64)
		if err != nil {
			panic(fmt.Sprintf("openapi tag of %s: %q is not a number", f.Name, v))
		}
		s[k] = n
	}
	if doc != "" {
		s["description"] = doc
	}
	return s
}

// describeLimits states this server's cpu and memory limits on the create
// request, whose fields are quantity strings (no numeric maximum applies).
func describeLimits(schemas map[string]any, l manager.Limits) {
	req, _ := schemas["CreateSandboxRequest"].(map[string]any)
	props, _ := req["properties"].(map[string]any)
	if props == nil {
		return
	}
	set := func(field, doc string) {
		if p, ok := props[field].(map[string]any); ok {
			p["description"] = doc
		}
	}
	set("cpu", fmt.Sprintf(`CPU quantity ("2", "0.5", "500m"), above 0 and at most %s on this server (%s); absent, null or "": DEFAULT_CPU`,
		strconv.FormatFloat(l.CPU, 'f', -1, 64), l.CPUFrom))
	mem := `memory quantity ("512Mi", "16Gi", bytes), above 0`
	if l.Memory > 0 {
		mem += fmt.Sprintf(" and at most %s on this server (%s)", manager.FormatMemory(l.Memory), l.MemoryFrom)
	}
	set("memory", mem+`; absent, null or "": DEFAULT_MEMORY`)
}

// describeGUIActions adds what the action types' JSON methods and the
// desktop's parser do beyond their fields: BrowserAction's "path", which
// its MarshalJSON writes from Points (drag) or File (upload_file), and the
// other forms a desktop request may take.
func describeGUIActions(schemas map[string]any) {
	if act, _ := schemas["BrowserAction"].(map[string]any); act != nil {
		props, _ := act["properties"].(map[string]any)
		point := map[string]any{"type": "array", "items": map[string]any{"type": "number"}, "minItems": 2, "maxItems": 2}
		props["path"] = map[string]any{"description": "drag: the points [[x,y],...]; upload_file: a file in the sandbox",
			"oneOf": []any{map[string]any{"type": "array", "items": point}, map[string]any{"type": "string"}}}
	}
	if req, _ := schemas["DesktopActionsRequest"].(map[string]any); req != nil {
		req["description"] = "The normalised form. The endpoint also reads {\"action\": {...}}, a bare action, or a JSON list of actions, " +
			"and each action in Anthropic's computer-use form ({\"action\": \"left_click\", \"coordinate\": [x, y]}) or OpenAI's " +
			"(click, move, keypress {keys: [...]}, scroll {scroll_x, scroll_y}); desktop/ACTIONS.md maps them."
	}
}

func (s *Server) openapi(c *gin.Context) error {
	c.JSON(http.StatusOK, s.OpenAPI())
	return nil
}
