package server_test

import (
	"net/http"
	"testing"
	"time"
)

// A live view cut off because its sandbox was deleted (the response is
// aborted, net/http drops the connection) is still a request the metrics
// count under its route.
func TestMetricsCountAbortedStream(t *testing.T) {
	srv, id := browserWithPage(t)
	req, _ := http.NewRequest("GET", srv.URL+"/sandboxes/"+id+"/browser/stream?fps=5", nil)
	req.Header.Set("X-API-Key", srv.APIKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("stream: %d", resp.StatusCode)
	}
	buf := make([]byte, 64<<10)
	if _, err := resp.Body.Read(buf); err != nil {
		t.Fatal(err)
	}
	want(t, call(t, srv, "DELETE", "/sandboxes/"+id, nil), 200)
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := resp.Body.Read(buf); err != nil {
				ended <- err
				return
			}
		}
	}()
	select {
	case <-ended:
	case <-time.After(30 * time.Second):
		t.Fatal("the live view still streams 30 s after its sandbox was deleted")
	}
	time.Sleep(200 * time.Millisecond)
	fams, _ := scrapeMetrics(t, srv)
	labels := map[string]string{"route": "/sandboxes/:id/browser/stream", "method": "GET", "status": "200"}
	if n := metricValue(fams, "orchard_http_requests_total", labels); n != 1 {
		t.Fatalf("orchard_http_requests_total%v = %v after the aborted stream, want 1", labels, n)
	}
}
