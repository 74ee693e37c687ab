package fleet

import (
	"net/http"
	"sync/atomic"

	"k8s.io/client-go/rest"
)

// RequestCounter counts the HTTP requests of the clients made from a
// rest.Config: a roll says what it cost the API server (a watch is one
// request however long it lasts).
type RequestCounter struct{ n atomic.Int64 }

// Count returns the requests sent so far.
func (c *RequestCounter) Count() int64 { return c.n.Load() }

// Wrap makes every client built from cfg afterwards count its requests
// (cfg is changed; a WrapTransport already set still applies).
func (c *RequestCounter) Wrap(cfg *rest.Config) {
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			c.n.Add(1)
			return rt.RoundTrip(req)
		})
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }
