package export

import (
	"io"
	"net/http"
	"strings"
)

// Health answers the Kubernetes probes served next to /metrics: Live for
// GET /healthz (liveness: restart the agent when it fails), Ready for GET
// /readyz (readiness). Each returns nil for yes, else an error whose
// message is the one-line reason given with the 503. They are called on
// the HTTP server's goroutines, so they must be safe for concurrent use,
// and quick: a probe has a timeout of its own.
type Health interface {
	Live() error
	Ready() error
}

// healthHandlers adds /healthz and /readyz to mux. Without h, /healthz
// says only that the process serves HTTP (the sidecar's case: it has no
// supervision loop of its own) and there is no /readyz.
func healthHandlers(mux *http.ServeMux, h Health) {
	if h == nil {
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { answer(w, nil) })
		return
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { answer(w, h.Live()) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) { answer(w, h.Ready()) })
}

// answer writes 200 "ok", or 503 with err's message on one line.
func answer(w http.ResponseWriter, err error) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if err == nil {
		io.WriteString(w, "ok\n")
		return
	}
	w.WriteHeader(http.StatusServiceUnavailable)
	io.WriteString(w, strings.ReplaceAll(err.Error(), "\n", " ")+"\n")
}
