package export

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
)

// fakeHealth is a Health of function fields.
type fakeHealth struct{ live, ready func() error }

func (f fakeHealth) Live() error  { return f.live() }
func (f fakeHealth) Ready() error { return f.ready() }

func TestHealthEndpoints(t *testing.T) {
	ok := func() error { return nil }
	tests := []struct {
		name   string
		health Health
		path   string
		code   int
		body   string
	}{
		{"no health: alive", nil, "/healthz", 200, "ok\n"},
		{"no health: no readyz", nil, "/readyz", 404, ""},
		{"live", fakeHealth{ok, ok}, "/healthz", 200, "ok\n"},
		{"ready", fakeHealth{ok, ok}, "/readyz", 200, "ok\n"},
		{"stuck", fakeHealth{func() error { return errors.New("loop stuck:\nno tick") }, ok}, "/healthz", 503, "loop stuck: no tick\n"},
		{"rendezvous", fakeHealth{ok, func() error { return errors.New("rendezvous") }}, "/readyz", 503, "rendezvous\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cleanEnv(t)
			cfg := config("", 1)
			cfg.MetricsAddr, cfg.Health = "127.0.0.1:0", tc.health
			e := start(t, cfg)
			resp, err := http.Get(strings.TrimSuffix(e.MetricsURL(), "/metrics") + tc.path)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.code || (tc.body != "" && string(body) != tc.body) {
				t.Errorf("GET %s: got %d %q, want %d %q", tc.path, resp.StatusCode, body, tc.code, tc.body)
			}
		})
	}
}
