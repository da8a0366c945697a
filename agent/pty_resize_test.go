package agent

import (
	"testing"
)

// Resize frames that arrive while the session ends must not touch the
// master's descriptor as it is closed (run with -race): pty.Setsize reads
// master.Fd() with no reference held, and after master.Close the number
// may already belong to another session's terminal or file.
func TestPTYResizeDuringClose(t *testing.T) {
	a := startAgent(t, nil)
	for range 20 {
		p := a.pty(t)
		p.init([]string{"sleep", "0.02"}, nil)
		p.ready()
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				if err := p.conn.WriteJSON(map[string]any{"type": "resize", "rows": 30, "cols": 100}); err != nil {
					return
				}
			}
		}()
		p.exit()
		p.conn.Close()
		<-done
	}
}
