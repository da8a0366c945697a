//go:build embedagent

package agentbin

import _ "embed"

// The agent, copied here by scripts/build.sh before a -tags embedagent build.
//
//go:embed orchard-agent
var embedded []byte
