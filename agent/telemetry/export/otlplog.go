package export

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc"
)

// rewarn is how often a failing export is warned about again.
const rewarn = 5 * time.Minute

// failureLog tells the agent's log about failing OTLP exports: a warning
// at the first failed export, with the endpoint, the protocol and a hint
// when the error says what is wrong (gRPC spoken to an OTLP/HTTP port, or
// the other way round); again at most every rewarn while it keeps
// failing, with what was dropped meanwhile; and the recovery. The wrapped
// exporters return nil to the SDK, so nothing also reaches the SDK's
// global error handler, batch after batch, or a deadline error at exit
// that says nothing of why. Safe for concurrent use.
type failureLog struct {
	log    *slog.Logger
	signal string // "traces", "metrics"
	ep     endpoint

	mu      sync.Mutex
	failing bool
	warned  time.Time // the last warning
	dropped int       // items dropped since the last warning
}

// failureLog makes the failure log of signal's exports to ep.
func (e *Exporter) failureLog(signal string, ep endpoint) *failureLog {
	f := &failureLog{log: e.log, signal: signal, ep: ep}
	e.fails = append(e.fails, f)
	return f
}

// result notes the outcome of one export of n items.
func (f *failureLog) result(n int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	switch {
	case err != nil && !f.failing:
		f.failing, f.warned, f.dropped = true, now, 0
		attrs := []any{"signal", f.signal, "endpoint", f.ep.String(), "protocol", f.ep.protocol, "dropped", n, "err", err}
		if h := hint(f.ep, err); h != "" {
			attrs = append(attrs, "hint", h)
		}
		f.log.Warn("otlp export failed; dropping data until the collector answers", attrs...)
	case err != nil && now.Sub(f.warned) >= rewarn:
		f.log.Warn("otlp export still failing", "signal", f.signal, "endpoint", f.ep.String(),
			"dropped", f.dropped+n, "since", now.Sub(f.warned).Round(time.Second), "err", err)
		f.warned, f.dropped = now, 0
	case err != nil:
		f.dropped += n
		f.log.Debug("otlp export failed", "signal", f.signal, "dropped", n, "err", err)
	case f.failing:
		f.failing = false
		f.log.Info("otlp export recovered", "signal", f.signal, "endpoint", f.ep.String())
	}
}

// attempt notes a failed attempt of a gRPC export, which the exporter
// may still retry until its timeout: the first warning comes at once,
// not after the retries (the export's result says whether data was lost).
func (f *failureLog) attempt(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failing {
		return
	}
	f.failing, f.warned, f.dropped = true, time.Now(), 0
	attrs := []any{"signal", f.signal, "endpoint", f.ep.String(), "protocol", f.ep.protocol, "err", err}
	if h := hint(f.ep, err); h != "" {
		attrs = append(attrs, "hint", h)
	}
	f.log.Warn("otlp export failed; retrying, then dropping data until the collector answers", attrs...)
}

// intercept is a gRPC client interceptor that sees every attempt of an
// export, retries included.
func (f *failureLog) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	if err != nil && ctx.Err() == nil {
		f.attempt(err)
	}
	return err
}

// dialOptions are the gRPC exporters' dial options: the interceptor, and
// the user agent that giving any dial options leaves out.
func (f *failureLog) dialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithUserAgent("ddp-agent (OTel Go OTLP exporter)"), grpc.WithChainUnaryInterceptor(f.intercept)}
}

// isFailing reports whether the last export failed.
func (f *failureLog) isFailing() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failing
}

// hint says what err, from an export to ep, probably means; "" when it
// says nothing more than itself.
func hint(ep endpoint, err error) string {
	msg := err.Error()
	has := func(subs ...string) bool {
		for _, s := range subs {
			if strings.Contains(msg, s) {
				return true
			}
		}
		return false
	}
	port := ep.port()
	switch {
	case ep.protocol == ProtocolGRPC && port == "4318":
		return "4318 is the OTLP/HTTP port: use http/protobuf there (an http:// endpoint, or OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf), or grpc on 4317"
	case ep.protocol == ProtocolHTTP && port == "4317":
		return "4317 is the OTLP/gRPC port: use grpc there (OTEL_EXPORTER_OTLP_PROTOCOL=grpc, or --otel-endpoint host:4317), or http/protobuf on http://host:4318"
	case has("connection refused"):
		return "nothing listens there: is the collector running with an OTLP receiver on that port?"
	case has("Unimplemented") && has("MetricsService"), has("404") && has("/v1/metrics"):
		// Jaeger's OTLP receivers take traces only.
		return "the endpoint takes no OTLP metrics (Jaeger takes traces only): send metrics to a collector, or set OTEL_METRICS_EXPORTER=none"
	case ep.protocol == ProtocolGRPC && has("http2", "server preface", "malformed header", "HTTP/1"):
		return "the endpoint does not speak gRPC: for an OTLP/HTTP receiver (usually port 4318) use http/protobuf"
	case ep.protocol == ProtocolHTTP && has("malformed HTTP", "transport connection broken", "readLoopPeekFailLocked", "EOF", "404",
		// A gRPC server resets a connection whose first bytes are not its
		// preface, sometimes mid-request; the client then sees the reset,
		// or its own side closed under the write.
		"connection reset by peer", "use of closed network connection"):
		return "the endpoint does not answer OTLP/HTTP: for an OTLP/gRPC receiver (usually port 4317) use grpc; check the URL path"
	case errors.Is(err, context.DeadlineExceeded) || has("DeadlineExceeded", "deadline exceeded"):
		return "no answer within the export timeout: is the endpoint reachable, and plaintext or TLS as its scheme says?"
	}
	return ""
}

// port is the endpoint's port, "" when unknown.
func (ep endpoint) port() string {
	hp := ep.hostPort
	if ep.fromEnv {
		_, v, _ := strings.Cut(ep.env, "=")
		if u, err := url.Parse(v); err == nil && u.Host != "" {
			hp = u.Host
		} else {
			hp = v // host:port without a scheme
		}
	}
	_, port, err := net.SplitHostPort(hp)
	if err != nil {
		return ""
	}
	return port
}

// loggedSpans is a span exporter whose failures go to the log.
type loggedSpans struct {
	sdktrace.SpanExporter
	fail *failureLog
}

func (l loggedSpans) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	err := l.SpanExporter.ExportSpans(ctx, spans)
	l.fail.result(len(spans), err)
	return nil
}

// loggedMetrics is a metric exporter whose failures go to the log.
type loggedMetrics struct {
	sdkmetric.Exporter
	fail *failureLog
}

func (l loggedMetrics) Export(ctx context.Context, rm *metricdata.ResourceMetrics) error {
	err := l.Exporter.Export(ctx, rm)
	n := 0
	for _, sm := range rm.ScopeMetrics {
		n += len(sm.Metrics)
	}
	l.fail.result(n, err)
	return nil
}
