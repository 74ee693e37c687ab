package readiness

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestHealthzIsOKOnlyFor200AndOk(t *testing.T) {
	for _, c := range []struct {
		code int
		body string
		ok   bool
	}{{200, "ok", true}, {200, "ok\n", true}, {500, "[-]syncloop failed", false}, {200, "not ok", false}} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/healthz" {
				http.NotFound(w, r)
				return
			}
			w.WriteHeader(c.code)
			w.Write([]byte(c.body))
		}))
		err := Healthz(context.Background(), strings.TrimPrefix(srv.URL, "http://"))
		srv.Close()
		if (err == nil) != c.ok {
			t.Errorf("HTTP %d %q: %v, want ok=%v", c.code, c.body, err, c.ok)
		}
	}
	if err := Healthz(context.Background(), "127.0.0.1:1"); err == nil {
		t.Error("nothing listening: no error")
	}
}

func TestLocalDNSReadyIsOKOnlyFor200AndOKAtReady(t *testing.T) {
	for _, c := range []struct {
		path string
		code int
		body string
		ok   bool
	}{{"/ready", 200, "OK", true}, {"/ready", 503, "forward", false}, {"/healthz", 200, "OK", false}, {"/ready", 200, "ok", false}} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != c.path {
				http.NotFound(w, r)
				return
			}
			w.WriteHeader(c.code)
			w.Write([]byte(c.body))
		}))
		err := LocalDNSReady(context.Background(), strings.TrimPrefix(srv.URL, "http://"))
		srv.Close()
		if (err == nil) != c.ok {
			t.Errorf("%s HTTP %d %q: %v, want ok=%v", c.path, c.code, c.body, err, c.ok)
		}
	}
}
