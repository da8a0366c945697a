package main

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/client"
)

func actCmd(conn *connection) *cobra.Command {
	var observe string
	cmd := &cobra.Command{
		Use:   "act SANDBOX ACTIONS",
		Short: "Run browser or desktop actions in a sandbox and print the result",
		Long: `Run one action (a JSON object) or a list of them in a browser or desktop
sandbox, in order, and print the JSON answer: each action's result and,
with --observe, the observation after them.

  orchard act sb1 '{"type":"navigate","url":"https://example.com"}' --observe '{"screenshot":"none","text":true}'
  orchard act sb2 '[{"action":"left_click","coordinate":[200,150]},{"action":"type","text":"hi"}]'

The command exits 1 when an action failed (its classified error is in the
answer).`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var actions json.RawMessage
			if err := json.Unmarshal([]byte(args[1]), &actions); err != nil {
				return fmt.Errorf("act: ACTIONS is not JSON: %w", err)
			}
			if len(actions) > 0 && actions[0] == '{' {
				actions = json.RawMessage("[" + string(actions) + "]")
			}
			req := map[string]json.RawMessage{"actions": actions}
			if observe != "" {
				if !json.Valid([]byte(observe)) {
					return fmt.Errorf("act: --observe is not JSON")
				}
				req["observe"] = json.RawMessage(observe)
			}
			c := conn.client()
			kind, err := guiKind(cmd, c, args[0], "act", "actions (orchard exec runs commands)")
			if err != nil {
				return err
			}
			var (
				out any
				ok  bool
			)
			if kind == api.KindBrowser {
				// Read as the browser reads it: a malformed action is
				// refused here, as it would be there.
				b, _ := json.Marshal(req)
				var breq api.BrowserActionsRequest
				if err := json.Unmarshal(b, &breq); err != nil {
					return fmt.Errorf("act: %w", err)
				}
				res, err := c.BrowserActions(cmd.Context(), args[0], breq)
				if err != nil {
					return err
				}
				out, ok = res, res.OK
			} else {
				// Passed as it is: the desktop reads other vocabularies
				// than api.DesktopAction's.
				res, err := c.DesktopActions(cmd.Context(), args[0], req)
				if err != nil {
					return err
				}
				out, ok = res, res.OK
			}
			b, err := json.Marshal(out)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), string(b))
			if !ok {
				return exitError{code: 1}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&observe, "observe", "", `observation to return after the actions, as JSON (e.g. '{"screenshot":"jpeg","som":true}')`)
	return cmd
}

func screenshotCmd(conn *connection) *cobra.Command {
	var (
		out, format  string
		quality, wid int
		scale        float64
	)
	cmd := &cobra.Command{
		Use:   "screenshot SANDBOX",
		Short: "Save a screenshot of a browser or desktop sandbox",
		Long: `Save a screenshot of a browser sandbox's active tab or a desktop sandbox's
screen, to a file (-o) or stdout. It prints the frame and scale that
actions on the image's pixels name.

  orchard screenshot sb1 -o shot.png
  orchard screenshot sb1 --format jpeg --width 640 -o small.jpg`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			q := url.Values{"format": {format}}
			if quality > 0 {
				q.Set("quality", strconv.Itoa(quality))
			}
			if wid > 0 {
				q.Set("width", strconv.Itoa(wid))
			}
			c := conn.client()
			kind, err := guiKind(cmd, c, args[0], "screenshot", "screenshots")
			if err != nil {
				return err
			}
			var img client.Image
			switch {
			case kind == api.KindBrowser:
				if scale > 0 {
					q.Set("scale", strconv.FormatFloat(scale, 'f', -1, 64))
				}
				img, err = c.BrowserScreenshot(cmd.Context(), args[0], q)
			case scale > 0:
				return fmt.Errorf("screenshot: --scale is for browser sandboxes; use --width")
			default:
				img, err = c.DesktopScreenshot(cmd.Context(), args[0], q)
			}
			if err != nil {
				return err
			}
			if out == "" || out == "-" {
				_, err = cmd.OutOrStdout().Write(img.Data)
				return err
			}
			if err := os.WriteFile(out, img.Data, 0o644); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "%s: %d bytes, frame %d, scale %g\n", out, len(img.Data), img.Frame, img.Scale)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&out, "output", "o", "", "file to write (default stdout)")
	f.StringVar(&format, "format", "png", "png or jpeg")
	f.IntVar(&quality, "quality", 0, "JPEG quality 1-100")
	f.IntVar(&wid, "width", 0, "scale down to this width")
	f.Float64Var(&scale, "scale", 0, "scale down by this factor, 0-1 (browser)")
	return cmd
}

// guiKind returns the kind of sandbox id, browser or desktop; any other
// kind is refused with a message naming what the command needs.
func guiKind(cmd *cobra.Command, c *client.Client, id, name, what string) (string, error) {
	sb, err := c.GetSandbox(cmd.Context(), id)
	if err != nil {
		return "", err
	}
	switch sb.Kind {
	case api.KindBrowser, api.KindDesktop:
		return sb.Kind, nil
	case "":
		sb.Kind = api.KindShell
	}
	return "", fmt.Errorf("%s: sandbox %s is a %s sandbox; %s need a browser or desktop one", name, id, sb.Kind, what)
}
