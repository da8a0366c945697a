// Package desktop runs an X11 desktop inside a sandbox for computer-use
// agents: a virtual X server (Xvfb) with a window manager and apps,
// synthetic input through the XTEST extension, and screenshots captured
// through MIT-SHM.
//
// Start launches the display and keeps it alive: when the X server or the
// window manager dies, a supervisor restarts it, and an X server death is
// recorded as a desktop.x_server_died fault (Err, LastFault); the next
// operation reconnects. Close kills every process the session started,
// and their descendants.
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
