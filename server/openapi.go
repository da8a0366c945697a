package server

import (
	"net/http"
	"reflect"
	"regexp"
	"strings"

	"github.com/gin-gonic/gin"
)

var ginParam = regexp.MustCompile(`:([a-zA-Z_]+)`)

// openAPIPath turns gin's "/sandboxes/:id" into "/sandboxes/{id}".
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
			params = append(params, map[string]any{"name": q.name, "in": "query", "required": q.required,
				"description": q.doc, "schema": map[string]any{"type": q.typ}})
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

// schemaOf describes t, registering named structs under components. A
// struct field's `doc` tag is its description.
func schemaOf(t reflect.Type, schemas map[string]any) map[string]any {
	nullable := false
	for t.Kind() == reflect.Pointer {
		t, nullable = t.Elem(), true
	}
	var s map[string]any
	switch {
	case t.Name() == "Command" && t.Kind() == reflect.String:
		s = map[string]any{"oneOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "array", "items": map[string]any{"type": "string"}}}}
	case t.Kind() == reflect.Struct:
		name := t.Name()
		if _, ok := schemas[name]; !ok {
			schemas[name] = map[string]any{} // breaks cycles
			props := map[string]any{}
			for i := range t.NumField() {
				f := t.Field(i)
				if !f.IsExported() {
					continue
				}
				tag := strings.Split(f.Tag.Get("json"), ",")[0]
				if tag == "-" {
					continue
				}
				if tag == "" {
					tag = f.Name
				}
				fs := schemaOf(f.Type, schemas)
				if doc := f.Tag.Get("doc"); doc != "" {
					if _, ref := fs["$ref"]; ref { // a $ref takes no siblings
						fs = map[string]any{"allOf": []any{fs}}
					}
					fs["description"] = doc
				}
				props[tag] = fs
			}
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

func (s *Server) openapi(c *gin.Context) error {
	c.JSON(http.StatusOK, s.OpenAPI())
	return nil
}
