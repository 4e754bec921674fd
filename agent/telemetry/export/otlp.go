package export

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// The OTLP protocols (OTEL_EXPORTER_OTLP_PROTOCOL).
const (
	ProtocolGRPC = "grpc"
	ProtocolHTTP = "http/protobuf"
)

// endpoint is where one signal goes over OTLP.
type endpoint struct {
	protocol string
	fromEnv  bool   // the exporter reads the OTEL_* variables itself
	env      string // then the variable naming the endpoint, NAME=value
	hostPort string // host:port
	path     string // base path of an http/protobuf endpoint, without the /v1/<signal>
	insecure bool
}

func (ep endpoint) String() string {
	if ep.fromEnv {
		return ep.env + " (" + ep.protocol + ")"
	}
	scheme := "https"
	if ep.insecure {
		scheme = "http"
	}
	return ep.protocol + " " + scheme + "://" + ep.hostPort + ep.path
}

// otlpEndpoint says where signal ("traces" or "metrics") goes: to
// cfgEndpoint when it is set (host:port, plaintext; or an http:// or
// https:// URL, for http/protobuf the base that /v1/<signal> is appended
// to), else where the OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_<SIGNAL>_ENDPOINT variables say. ok is false when
// neither names one, OTEL_SDK_DISABLED is true, or OTEL_<SIGNAL>_EXPORTER
// is none. protocol "" takes OTEL_EXPORTER_OTLP_<SIGNAL>_PROTOCOL,
// OTEL_EXPORTER_OTLP_PROTOCOL, then the specification's default,
// http/protobuf; a configured host:port without a scheme (the flag's
// documented gRPC form) means grpc.
func otlpEndpoint(cfgEndpoint, protocol, signal string) (ep endpoint, ok bool, err error) {
	sig := strings.ToUpper(signal)
	if protocol == "" {
		protocol = firstEnv("OTEL_EXPORTER_OTLP_"+sig+"_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	switch protocol {
	case "":
		protocol = ProtocolHTTP
		if cfgEndpoint != "" && !strings.Contains(cfgEndpoint, "://") {
			protocol = ProtocolGRPC
		}
	case ProtocolGRPC, ProtocolHTTP:
	default:
		return endpoint{}, false, fmt.Errorf("otlp protocol %q: want %s or %s", protocol, ProtocolGRPC, ProtocolHTTP)
	}
	ep.protocol = protocol
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") {
		return endpoint{}, false, nil
	}
	switch exp := strings.ToLower(strings.TrimSpace(os.Getenv("OTEL_" + sig + "_EXPORTER"))); exp {
	case "", "otlp":
	case "none":
		return endpoint{}, false, nil
	default:
		return endpoint{}, false, fmt.Errorf("OTEL_%s_EXPORTER=%s: only otlp and none are supported", sig, exp)
	}
	if cfgEndpoint == "" {
		name := "OTEL_EXPORTER_OTLP_" + sig + "_ENDPOINT"
		if os.Getenv(name) == "" {
			name = "OTEL_EXPORTER_OTLP_ENDPOINT"
		}
		if os.Getenv(name) == "" {
			return endpoint{}, false, nil
		}
		ep.fromEnv, ep.env = true, name+"="+os.Getenv(name)
		return ep, true, nil
	}
	if err := ep.parse(cfgEndpoint); err != nil {
		return endpoint{}, false, fmt.Errorf("--otel-endpoint %q: %w (want host:port for OTLP/gRPC, or an http:// or https:// URL)", cfgEndpoint, err)
	}
	return ep, true, nil
}

// CheckEndpoint checks what New would take the OTLP endpoints from:
// cfgEndpoint (--otel-endpoint) and the OTEL_* variables, for both
// signals. A mistake there is the command line's, to be said before
// anything starts; New found it only after the plugins had started, and
// the agent exited 1 with a job_failed sent to the notifiers.
func CheckEndpoint(cfgEndpoint string) error {
	for _, signal := range []string{"traces", "metrics"} {
		if _, _, err := otlpEndpoint(cfgEndpoint, "", signal); err != nil {
			return err
		}
	}
	return nil
}

func (ep *endpoint) parse(s string) error {
	ep.insecure = true
	if strings.Contains(s, "://") {
		u, err := url.Parse(s)
		if err != nil {
			return err
		}
		switch u.Scheme {
		case "http":
		case "https":
			ep.insecure = false
		default:
			return fmt.Errorf("scheme %q: want http or https, or host:port", u.Scheme)
		}
		if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
			return fmt.Errorf("want scheme://host:port[/path]")
		}
		s, ep.path = u.Host, strings.TrimSuffix(u.Path, "/")
		if u.Port() == "" {
			if ep.insecure {
				s += ":80"
			} else {
				s += ":443"
			}
		}
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return err
	}
	if host == "" || port == "" {
		return fmt.Errorf("want host:port")
	}
	ep.hostPort = s
	return nil
}

func firstEnv(names ...string) string {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			return v
		}
	}
	return ""
}

func newSpanExporter(ctx context.Context, ep endpoint, timeout time.Duration, fail *failureLog) (sdktrace.SpanExporter, error) {
	if ep.protocol == ProtocolHTTP {
		opts := []otlptracehttp.Option{otlptracehttp.WithTimeout(timeout)}
		if !ep.fromEnv {
			opts = append(opts, otlptracehttp.WithEndpoint(ep.hostPort), otlptracehttp.WithURLPath(ep.path+"/v1/traces"))
			if ep.insecure {
				opts = append(opts, otlptracehttp.WithInsecure())
			}
		}
		return otlptracehttp.New(ctx, opts...)
	}
	opts := []otlptracegrpc.Option{otlptracegrpc.WithTimeout(timeout), otlptracegrpc.WithDialOption(fail.dialOptions()...)}
	if !ep.fromEnv {
		opts = append(opts, otlptracegrpc.WithEndpoint(ep.hostPort))
		if ep.insecure {
			opts = append(opts, otlptracegrpc.WithInsecure())
		}
	}
	return otlptracegrpc.New(ctx, opts...)
}

func newMetricExporter(ctx context.Context, ep endpoint, timeout time.Duration, fail *failureLog) (sdkmetric.Exporter, error) {
	if ep.protocol == ProtocolHTTP {
		opts := []otlpmetrichttp.Option{otlpmetrichttp.WithTimeout(timeout)}
		if !ep.fromEnv {
			opts = append(opts, otlpmetrichttp.WithEndpoint(ep.hostPort), otlpmetrichttp.WithURLPath(ep.path+"/v1/metrics"))
			if ep.insecure {
				opts = append(opts, otlpmetrichttp.WithInsecure())
			}
		}
		return otlpmetrichttp.New(ctx, opts...)
	}
	opts := []otlpmetricgrpc.Option{otlpmetricgrpc.WithTimeout(timeout), otlpmetricgrpc.WithDialOption(fail.dialOptions()...)}
	if !ep.fromEnv {
		opts = append(opts, otlpmetricgrpc.WithEndpoint(ep.hostPort))
		if ep.insecure {
			opts = append(opts, otlpmetricgrpc.WithInsecure())
		}
	}
	return otlpmetricgrpc.New(ctx, opts...)
}
