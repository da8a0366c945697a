// Package desktop runs an X11 desktop inside a sandbox for computer-use
// agents: a virtual X server (Xvfb) with a window manager and apps,
// synthetic input through the XTEST extension, and screenshots captured
// through MIT-SHM.
//
// Start launches the display and keeps it alive: when the X server or the
// window manager dies, a supervisor restarts it and records the death as a
// classified fault, which LastFault and the next actions response report.
// An X server death is desktop.x_server_died: Err returns it while the
// server is down, and the next operation waits for the restart and
// reconnects. A window manager death is desktop.wm_died and fails nothing,
// as input and capture need no window manager; after wmRestartLimit deaths
// in a row, each soon after its start, the fault says the window manager
// is down for good and the session runs on without one. Close kills every
// process the session started, and their descendants.
//
// Input and capture talk X11 directly over the display's socket (the
// pure-Go jezek/xgb), without xdotool or ImageMagick: a click with its
// round trip takes well under a millisecond, and a capture converted to
// RGBA one or two. Encoding the screenshot is the expensive part.
//
// Actions (Do, Run) take the normalised action set of this package or
// Anthropic's and OpenAI's computer-use actions, mapped as the Action
// type's documentation and ACTIONS.md describe. Their coordinates are
// pixels of the latest screenshot, which may be scaled down: every
// screenshot is a Frame whose scale maps its pixels back to the screen's.
//
// The package builds without cgo and never imports the control plane's
// libraries: it runs inside the sandbox, in the agent.
package desktop
