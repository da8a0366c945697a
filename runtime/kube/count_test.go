package kube

import (
	"net/http"
	"net/url"
	"testing"
)

func TestDescribeRequest(t *testing.T) {
	tests := []struct{ method, url, verb, res string }{
		{"POST", "/api/v1/namespaces/ns/pods", "create", "pods"},
		{"DELETE", "/api/v1/namespaces/ns/pods/sandbox-x", "delete", "pods"},
		{"GET", "/api/v1/namespaces/ns/pods/sandbox-x", "get", "pods"},
		{"GET", "/api/v1/namespaces/ns/pods?labelSelector=a", "list", "pods"},
		{"GET", "/api/v1/namespaces/ns/pods?watch=true&resourceVersion=5", "watch", "pods"},
		{"PUT", "/api/v1/namespaces/ns/pods/sandbox-x/status", "update", "pods/status"},
		{"POST", "/apis/networking.k8s.io/v1/namespaces/ns/networkpolicies", "create", "networkpolicies"},
		{"GET", "/api/v1/namespaces/ns", "get", "namespaces"},
		{"POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", "create", "selfsubjectaccessreviews"},
		{"GET", "/version", "list", "other"},
	}
	for _, tt := range tests {
		u, _ := url.Parse("https://k" + tt.url)
		verb, res := describeRequest(&http.Request{Method: tt.method, URL: u})
		if verb != tt.verb || res != tt.res {
			t.Errorf("%s %s = %s %s, want %s %s", tt.method, tt.url, verb, res, tt.verb, tt.res)
		}
	}
}
