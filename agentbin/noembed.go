//go:build !embedagent

package agentbin

var embedded []byte
