package main

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/orchard/orchard/client"
	"github.com/orchard/orchard/faults"
)

// defaultURL is the server the client commands talk to when neither a flag
// nor the environment names one (`orchard serve`'s default address).
const defaultURL = "http://127.0.0.1:8000"

// addClientCommands adds the commands that talk to a server: sandbox, exec,
// cp, shell, act, screenshot, run and dataset. They share the connection flags --url and --api-key.
func addClientCommands(root *cobra.Command, getenv func(string) string) {
	conn := &connection{getenv: getenv}
	for _, cmd := range []*cobra.Command{sandboxCmd(conn), execCmd(conn), cpCmd(conn), shellCmd(conn), actCmd(conn), screenshotCmd(conn), runCmd(conn), datasetCmd(conn)} {
		conn.register(cmd)
		wrapErrors(cmd)
		root.AddCommand(cmd)
	}
}

// connection is where the client commands find the server: flags, then
// Orchard's environment names, then Orchard Env SDK's, then defaultURL.
type connection struct {
	getenv func(string) string
	url    string
	apiKey string
}

func (c *connection) register(cmd *cobra.Command) {
	f := cmd.PersistentFlags()
	f.StringVar(&c.url, "url", "", "server URL (env ORCHARD_URL or SANDBOX_BASE_URL; default "+defaultURL+")")
	f.StringVar(&c.apiKey, "api-key", "", "API key (env ORCHARD_API_KEY or SANDBOX_API_KEY)")
}

// client returns a client for the configured server.
func (c *connection) client() *client.Client {
	url := firstSet(c.url, c.getenv("ORCHARD_URL"), c.getenv("SANDBOX_BASE_URL"), defaultURL)
	key := firstSet(c.apiKey, c.getenv("ORCHARD_API_KEY"), c.getenv("SANDBOX_API_KEY"))
	return client.New(url, key, client.WithUserAgent("orchard-cli/"+version))
}

func firstSet(vals ...string) string {
	for _, v := range vals {
		if v = strings.TrimSpace(v); v != "" {
			return v
		}
	}
	return ""
}

// cliError prints a classified error as `<message> (<code>)`; main adds
// the "orchard: " prefix.
type cliError struct {
	err  error
	code string
}

func (e cliError) Error() string { return fmt.Sprintf("%s (%s)", e.err.Error(), e.code) }
func (e cliError) Unwrap() error { return e.err }

// wrapErrors makes cmd and its subcommands report classified errors with
// their code. Exit codes pass through untouched.
func wrapErrors(cmd *cobra.Command) {
	if run := cmd.RunE; run != nil {
		cmd.RunE = func(cmd *cobra.Command, args []string) error { return classified(run(cmd, args)) }
	}
	for _, sub := range cmd.Commands() {
		wrapErrors(sub)
	}
}

func classified(err error) error {
	var ee exitError
	var fe *faults.Error
	switch {
	case err == nil || errors.As(err, &ee):
		return err
	case errors.As(err, &fe) && fe.Code != "":
		return cliError{err: err, code: fe.Code}
	}
	return err
}

// printError writes a classified message as main would print an error.
func printError(w io.Writer, msg, code string) {
	if code != "" {
		fmt.Fprintf(w, "orchard: %s (%s)\n", msg, code)
		return
	}
	fmt.Fprintf(w, "orchard: %s\n", msg)
}

// parseKV parses repeated K=V flags.
func parseKV(flag string, pairs []string) (map[string]string, error) {
	if len(pairs) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(pairs))
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--%s %q: want KEY=VALUE", flag, p)
		}
		m[k] = v
	}
	return m, nil
}

// exitStatus is the process exit status for a remote exit code: a command
// killed by signal N (code -N) exits 128+N, as a shell reports it.
func exitStatus(code int) int {
	if code < 0 {
		return 128 - code
	}
	return code
}
