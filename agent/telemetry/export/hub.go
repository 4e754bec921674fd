package export

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
)

// Hub serves the metrics of several exporters on one address: the
// sidecar's, which watches every job of its user on the node. Every series
// carries its job's ddp_job_id, so one scrape tells the jobs apart. It
// answers /healthz too (ok while it serves HTTP). A job's series are served
// from its exporter's start to its Shutdown.
type Hub struct {
	log  *slog.Logger
	srv  *http.Server
	done chan struct{}
	url  string

	mu   sync.Mutex
	regs []*prometheus.Registry
}

// ServeHub listens on addr and serves the registered exporters' metrics
// on /metrics.
func ServeHub(addr string, log *slog.Logger) (*Hub, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("prometheus listener: %w", err)
	}
	h := &Hub{log: log, done: make(chan struct{})}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(h, promhttp.HandlerOpts{}))
	healthHandlers(mux, nil)
	h.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	h.url = "http://" + net.JoinHostPort(urlHost(ln.Addr().(*net.TCPAddr)), strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)) + "/metrics"
	go func() {
		defer close(h.done)
		if err := h.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("prometheus endpoint stopped", "addr", ln.Addr().String(), "err", err)
		}
	}()
	log.Info("serving prometheus metrics of every job", "url", h.url)
	return h, nil
}

// Gather merges the registered exporters' metrics (prometheus.Gatherer).
func (h *Hub) Gather() ([]*dto.MetricFamily, error) {
	h.mu.Lock()
	gs := make(prometheus.Gatherers, len(h.regs))
	for i, r := range h.regs {
		gs[i] = r
	}
	h.mu.Unlock()
	return gs.Gather()
}

// add serves reg's metrics; the returned func stops serving them.
func (h *Hub) add(reg *prometheus.Registry) func() {
	h.mu.Lock()
	h.regs = append(h.regs, reg)
	h.mu.Unlock()
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		for i, r := range h.regs {
			if r == reg {
				h.regs = append(h.regs[:i], h.regs[i+1:]...)
				return
			}
		}
	}
}

// URL is where the metrics are scraped; a listener on all addresses is
// named by 127.0.0.1.
func (h *Hub) URL() string { return h.url }

// Close stops serving, waiting for scrapes in flight until ctx is done.
func (h *Hub) Close(ctx context.Context) error {
	err := h.srv.Shutdown(ctx)
	if err != nil {
		h.srv.Close()
	}
	<-h.done
	return err
}

// urlHost names a listener's address in a URL: 127.0.0.1 for all addresses.
func urlHost(addr *net.TCPAddr) string {
	if addr.IP.IsUnspecified() {
		return "127.0.0.1"
	}
	return addr.IP.String()
}
