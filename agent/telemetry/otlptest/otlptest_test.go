package otlptest_test

import (
	"bytes"
	"context"
	"net/http"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/ddp-agent/ddp-agent/agent/telemetry/otlptest"
)

func TestGRPCTraces(t *testing.T) {
	rcv := otlptest.Start(t)
	exp, err := otlptracegrpc.New(t.Context(), otlptracegrpc.WithEndpoint(rcv.Addr()), otlptracegrpc.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", "test"))))
	_, span := tp.Tracer("otlptest").Start(t.Context(), "work")
	span.SetAttributes(attribute.Int("n", 3), attribute.IntSlice("ranks", []int{1, 2}))
	span.End()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	spans, err := rcv.WaitSpans(ctx, func(s []otlptest.Span) bool { return len(s) == 1 })
	if err != nil {
		t.Fatalf("WaitSpans: %v", err)
	}
	s := spans[0]
	if s.Name != "work" || s.Attr("n") != int64(3) || s.Resource["service.name"] != "test" || s.Scope != "otlptest" {
		t.Errorf("got span %q n=%v resource %v scope %q", s.Name, s.Attr("n"), s.Resource, s.Scope)
	}
	if got := s.Attr("ranks").([]any); len(got) != 2 || got[1] != int64(2) {
		t.Errorf("ranks = %v, want [1 2]", got)
	}
	if s.TraceIDHex() != span.SpanContext().TraceID().String() {
		t.Errorf("trace id %s, want %s", s.TraceIDHex(), span.SpanContext().TraceID())
	}
	if err := tp.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestHTTPMetrics(t *testing.T) {
	rcv := otlptest.Start(t)
	exp, err := otlpmetrichttp.New(t.Context(), otlpmetrichttp.WithEndpointURL(rcv.HTTPEndpoint()+"/v1/metrics"),
		otlpmetrichttp.WithCompression(otlpmetrichttp.GzipCompression))
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp)))
	c, _ := mp.Meter("otlptest").Int64Counter("things")
	c.Add(t.Context(), 5)
	if err := mp.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	ms := rcv.Metrics()
	if len(ms) != 1 || ms[0].Name != "things" || ms[0].GetSum().GetDataPoints()[0].GetAsInt() != 5 {
		t.Errorf("got %v, want things = 5", ms)
	}
}

func TestHTTPJSON(t *testing.T) {
	rcv := otlptest.Start(t)
	req := &coltracepb.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{{
		ScopeSpans: []*tracepb.ScopeSpans{{
			Scope: &commonpb.InstrumentationScope{Name: "json"},
			Spans: []*tracepb.Span{{TraceId: bytes.Repeat([]byte{1}, 16), SpanId: bytes.Repeat([]byte{2}, 8), Name: "from json"}},
		}},
	}}}
	body, err := protojson.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(rcv.HTTPEndpoint()+"/v1/traces", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %s", resp.Status)
	}
	if s := rcv.Spans(); len(s) != 1 || s[0].Name != "from json" || s[0].TraceIDHex() != "01010101010101010101010101010101" {
		t.Errorf("got %v", s)
	}
}

func TestWaitTimeout(t *testing.T) {
	rcv := otlptest.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if _, err := rcv.WaitSpans(ctx, func(s []otlptest.Span) bool { return len(s) > 0 }); err != context.DeadlineExceeded {
		t.Errorf("WaitSpans: got %v, want %v", err, context.DeadlineExceeded)
	}
}
