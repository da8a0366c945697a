// Package browser drives one long-lived Chromium over the DevTools protocol
// for an agent inside a sandbox: it launches the browser, keeps track of its
// tabs, runs actions (navigate, click, type, ...) one at a time per tab,
// takes observations (screenshot, set-of-marks elements, a compact
// accessibility tree, visible text), and classifies every failure as a
// faults.Error at the point where it is first seen.
//
// Coordinates in actions are screenshot pixels of an observation: every
// observation carries a frame id and the scale between its screenshot and
// CSS pixels, and actions are mapped back through the scale of the frame
// they name (or of the latest observation of the tab).
//
// After each action the tab waits for the page to settle, so that the next
// observation shows what the action brought: no request in flight and no
// DOM mutation for a window, or sooner, once a script installed in every
// document (pending.js) sees nothing left that the page scheduled.
//
// The package knows nothing about sandboxes or HTTP. The types with JSON
// tags (Action, Result, Observation, ObserveOptions, Request, Response) are
// the wire shapes of API.md.
package browser
