package browser

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A request's settle override reaches the wait after its actions: with the
// defaults the observation shows what a click's slow fetch brought in;
// capped at a few milliseconds it does not yet.
func TestRequestSettleOverride(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			time.Sleep(300 * time.Millisecond)
			fmt.Fprint(w, "arrived")
			return
		}
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprint(w, `<html><body><button id="b" onclick="fetch('/slow').then(r=>r.text()).then(t=>{document.getElementById('out').textContent=t})">go</button><p id="out">waiting</p></body></html>`)
	}))
	defer srv.Close()
	s := openPage(t, "/basic.html")
	cases := []struct {
		name   string
		settle *Settle
		want   string
	}{
		{"defaults wait for the fetch", nil, "arrived"},
		{"capped settle returns first", &Settle{TimeoutMS: 5}, "waiting"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mustDo(t, s, Action{Type: ActNavigate, URL: srv.URL})
			resp, err := s.Run(ctxT(t), Request{Actions: []Action{{Type: ActClick, Selector: "#b"}},
				Observe: &ObserveOptions{Screenshot: "none", Text: true}, Settle: c.settle})
			if err != nil || !resp.OK {
				t.Fatalf("%+v %v", resp, err)
			}
			if !strings.Contains(resp.Observation.Text, c.want) {
				t.Errorf("text %q, want %q", resp.Observation.Text, c.want)
			}
		})
	}
}
