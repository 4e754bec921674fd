// Package otlptest is an OTLP receiver for tests: a real gRPC server (and
// an OTLP/HTTP one) on the loopback interface that keeps every span and
// metric it is sent, for tests of anything that exports OpenTelemetry
// data, in process or from another process.
package otlptest

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	colmetricpb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	metricpb "go.opentelemetry.io/proto/otlp/metrics/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	_ "google.golang.org/grpc/encoding/gzip" // OTEL_EXPORTER_OTLP_COMPRESSION=gzip
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// Span is a received span with the attributes of the resource and the
// name of the scope it came with.
type Span struct {
	*tracepb.Span
	Resource map[string]any
	Scope    string
}

// Attr is the span's attribute key as a Go value (see Attrs), nil without
// it.
func (s Span) Attr(key string) any { return Attrs(s.Attributes)[key] }

// TraceIDHex is the span's trace id in hex, as trace viewers show it.
func (s Span) TraceIDHex() string { return hex.EncodeToString(s.TraceId) }

// Metric is a received metric with the attributes of its resource.
type Metric struct {
	*metricpb.Metric
	Resource map[string]any
	Scope    string
}

// Attrs turns OTLP attributes into a map of Go values: string, bool,
// int64, float64, []byte, []any, or map[string]any.
func Attrs(kvs []*commonpb.KeyValue) map[string]any {
	m := make(map[string]any, len(kvs))
	for _, kv := range kvs {
		m[kv.Key] = value(kv.Value)
	}
	return m
}

func value(v *commonpb.AnyValue) any {
	switch v := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return v.StringValue
	case *commonpb.AnyValue_BoolValue:
		return v.BoolValue
	case *commonpb.AnyValue_IntValue:
		return v.IntValue
	case *commonpb.AnyValue_DoubleValue:
		return v.DoubleValue
	case *commonpb.AnyValue_BytesValue:
		return v.BytesValue
	case *commonpb.AnyValue_ArrayValue:
		var a []any
		for _, e := range v.ArrayValue.GetValues() {
			a = append(a, value(e))
		}
		return a
	case *commonpb.AnyValue_KvlistValue:
		return Attrs(v.KvlistValue.GetValues())
	}
	return nil
}

// Receiver is a running OTLP receiver. Its methods are safe for concurrent
// use.
type Receiver struct {
	grpcLn, httpLn net.Listener
	grpc           *grpc.Server
	http           *http.Server

	mu      sync.Mutex
	spans   []Span
	metrics []Metric
	changed chan struct{} // closed and replaced when something arrives
}

// Start starts a receiver on 127.0.0.1 (OTLP/gRPC on Addr, OTLP/HTTP on
// HTTPEndpoint) and stops it when the test ends.
func Start(t testing.TB) *Receiver {
	t.Helper()
	r := &Receiver{changed: make(chan struct{})}
	var err error
	if r.grpcLn, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatalf("otlptest: %v", err)
	}
	if r.httpLn, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		r.grpcLn.Close()
		t.Fatalf("otlptest: %v", err)
	}
	r.grpc = grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(r.grpc, traceService{r: r})
	colmetricpb.RegisterMetricsServiceServer(r.grpc, metricsService{r: r})
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", r.serveHTTP(func() proto.Message { return &coltracepb.ExportTraceServiceRequest{} },
		&coltracepb.ExportTraceServiceResponse{}))
	mux.HandleFunc("POST /v1/metrics", r.serveHTTP(func() proto.Message { return &colmetricpb.ExportMetricsServiceRequest{} },
		&colmetricpb.ExportMetricsServiceResponse{}))
	r.http = &http.Server{Handler: mux}

	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); r.grpc.Serve(r.grpcLn) }()
	go func() { defer wg.Done(); r.http.Serve(r.httpLn) }()
	t.Cleanup(func() {
		r.grpc.Stop()
		r.http.Close()
		wg.Wait()
	})
	return r
}

// Addr is the OTLP/gRPC address, host:port (plaintext).
func (r *Receiver) Addr() string { return r.grpcLn.Addr().String() }

// HTTPEndpoint is the base URL of OTLP/HTTP (protobuf or JSON), to which
// exporters append /v1/traces and /v1/metrics, as in
// OTEL_EXPORTER_OTLP_ENDPOINT.
func (r *Receiver) HTTPEndpoint() string { return "http://" + r.httpLn.Addr().String() }

// Spans returns the spans received so far, in order of arrival.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Metrics returns the metrics received so far, in order of arrival: with
// cumulative temporality each export repeats the totals, so the last of a
// name is the newest.
func (r *Receiver) Metrics() []Metric {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Metric(nil), r.metrics...)
}

// WaitSpans blocks until ok holds for the spans received so far, and
// returns them; or until ctx is done, returning them with ctx's error.
func (r *Receiver) WaitSpans(ctx context.Context, ok func([]Span) bool) ([]Span, error) {
	return wait(ctx, r, r.Spans, ok)
}

// WaitMetrics is WaitSpans for metrics.
func (r *Receiver) WaitMetrics(ctx context.Context, ok func([]Metric) bool) ([]Metric, error) {
	return wait(ctx, r, r.Metrics, ok)
}

func wait[T any](ctx context.Context, r *Receiver, get func() []T, ok func([]T) bool) ([]T, error) {
	for {
		r.mu.Lock()
		ch := r.changed
		r.mu.Unlock()
		got := get()
		if ok(got) {
			return got, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return got, ctx.Err()
		}
	}
}

func (r *Receiver) addTraces(req *coltracepb.ExportTraceServiceRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		res := resourceAttrs(rs.Resource)
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				r.spans = append(r.spans, Span{Span: s, Resource: res, Scope: ss.GetScope().GetName()})
			}
		}
	}
	close(r.changed)
	r.changed = make(chan struct{})
}

func (r *Receiver) addMetrics(req *colmetricpb.ExportMetricsServiceRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rm := range req.ResourceMetrics {
		res := resourceAttrs(rm.Resource)
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				r.metrics = append(r.metrics, Metric{Metric: m, Resource: res, Scope: sm.GetScope().GetName()})
			}
		}
	}
	close(r.changed)
	r.changed = make(chan struct{})
}

func resourceAttrs(res *resourcepb.Resource) map[string]any { return Attrs(res.GetAttributes()) }

type traceService struct {
	coltracepb.UnimplementedTraceServiceServer
	r *Receiver
}

func (s traceService) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	s.r.addTraces(req)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

type metricsService struct {
	colmetricpb.UnimplementedMetricsServiceServer
	r *Receiver
}

func (s metricsService) Export(_ context.Context, req *colmetricpb.ExportMetricsServiceRequest) (*colmetricpb.ExportMetricsServiceResponse, error) {
	s.r.addMetrics(req)
	return &colmetricpb.ExportMetricsServiceResponse{}, nil
}

// serveHTTP handles an OTLP/HTTP export: protobuf or JSON, gzipped or not.
func (r *Receiver) serveHTTP(newReq func() proto.Message, resp proto.Message) http.HandlerFunc {
	return func(w http.ResponseWriter, hr *http.Request) {
		body, err := readBody(hr)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		req := newReq()
		jsonBody := strings.HasPrefix(hr.Header.Get("Content-Type"), "application/json")
		if jsonBody {
			err = protojson.Unmarshal(body, req)
		} else {
			err = proto.Unmarshal(body, req)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		switch req := req.(type) {
		case *coltracepb.ExportTraceServiceRequest:
			r.addTraces(req)
		case *colmetricpb.ExportMetricsServiceRequest:
			r.addMetrics(req)
		}
		var out []byte
		if jsonBody {
			w.Header().Set("Content-Type", "application/json")
			out, err = protojson.Marshal(resp)
		} else {
			w.Header().Set("Content-Type", "application/x-protobuf")
			out, err = proto.Marshal(resp)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Write(out)
	}
}

func readBody(hr *http.Request) ([]byte, error) {
	body, err := io.ReadAll(hr.Body)
	if err != nil {
		return nil, err
	}
	switch hr.Header.Get("Content-Encoding") {
	case "", "identity":
		return body, nil
	case "gzip":
		zr, err := gzip.NewReader(bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		return io.ReadAll(zr)
	}
	return nil, errors.New("unsupported content encoding " + hr.Header.Get("Content-Encoding"))
}
