package export

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// scope is the instrumentation scope of every span and metric.
const scope = "github.com/ddp-agent/ddp-agent/agent/telemetry/export"

// tracers are the exporter's tracer providers: one for the agent's own
// spans (the step root, hang, restart), whose resource has service.name
// = the base service name, and one per rank (and host), made on first
// use, whose resource names the rank: service.name "<base> rank R". A
// trace viewer labels each row with its service.name, so Jaeger reads
// "ddp-agent rank 3 allreduce" rather than "ddp-agent allreduce" for
// every rank alike. All of them feed one batch span processor and so
// one OTLP exporter and connection: the SDK's exporter groups a batch's
// spans by resource.
//
// tracers is not safe for concurrent use: the Exporter calls it under
// its lock.
type tracers struct {
	base    *resource.Resource
	service string // the base service name: "ddp-agent" or OTEL_SERVICE_NAME
	job     string
	bsp     sdktrace.SpanProcessor // shared; shut down last

	agentT    trace.Tracer
	ranks     map[rankKey]trace.Tracer
	providers []*sdktrace.TracerProvider // the agent's, then every rank's
}

// rankKey is one rank on one host: a rank that moves to another host in a
// later generation gets another resource.
type rankKey struct {
	rank int
	host string
}

func newTracers(base *resource.Resource, job string, bsp sdktrace.SpanProcessor) *tracers {
	service := "ddp-agent"
	if v, ok := base.Set().Value("service.name"); ok && v.AsString() != "" {
		service = v.AsString()
	}
	t := &tracers{base: base, service: service, job: job, bsp: bsp, ranks: map[rankKey]trace.Tracer{}}
	t.agentT = t.provider(base).Tracer(scope)
	return t
}

func (t *tracers) provider(res *resource.Resource) *sdktrace.TracerProvider {
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithResource(res),
		sdktrace.WithIDGenerator(idGenerator{}),
		sdktrace.WithSampler(sdktrace.AlwaysSample()), // the exporter samples by step itself
		sdktrace.WithSpanProcessor(borrowed{t.bsp}),
	)
	t.providers = append(t.providers, tp)
	return tp
}

// rank is the tracer of rank's spans; host is where the rank runs, ""
// when unknown (the resource keeps the agent's host.name then).
func (t *tracers) rank(rank int, host string) trace.Tracer {
	k := rankKey{rank, host}
	if tr, ok := t.ranks[k]; ok {
		return tr
	}
	res, err := rankResource(t.base, t.service, t.job, rank, host)
	if err != nil { // only on conflicting schema URLs, which rankResource has none of
		res = t.base
	}
	tr := t.provider(res).Tracer(scope)
	t.ranks[k] = tr
	return tr
}

// rankResource is base with the rank's service identity: service.name
// "<service> rank R", service.namespace <service> (unless base has one),
// service.instance.id "<job>/rank-R", ddp.rank, and host.name when known.
func rankResource(base *resource.Resource, service, job string, rank int, host string) (*resource.Resource, error) {
	r := strconv.Itoa(rank)
	attrs := []attribute.KeyValue{
		attribute.String("service.name", service+" rank "+r),
		attribute.String("service.instance.id", job+"/rank-"+r),
		attribute.Int("ddp.rank", rank),
	}
	if _, ok := base.Set().Value("service.namespace"); !ok {
		attrs = append(attrs, attribute.String("service.namespace", service))
	}
	if host != "" {
		attrs = append(attrs, attribute.String("host.name", host))
	}
	return resource.Merge(base, resource.NewSchemaless(attrs...))
}

// shutdown ends every provider, then the shared processor, which exports
// what it still holds.
func (t *tracers) shutdown(ctx context.Context) error {
	var err error
	for _, tp := range t.providers {
		err = errors.Join(err, tp.Shutdown(ctx))
	}
	if perr := t.bsp.Shutdown(ctx); perr != nil {
		err = errors.Join(err, fmt.Errorf("span processor: %w", perr))
	}
	return err
}

// borrowed is the shared span processor as one provider sees it: a
// provider's Shutdown must not shut down what the other providers still
// use; tracers.shutdown does that once, last.
type borrowed struct{ sdktrace.SpanProcessor }

func (borrowed) Shutdown(context.Context) error { return nil }
