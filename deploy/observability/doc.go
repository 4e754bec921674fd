// Package observability holds no code: deploy/observability is the
// configuration that wires ddp-agent's traces and metrics into an
// OpenTelemetry Collector, Jaeger, Prometheus and Grafana (README.md). Its
// tests check those files on the real tools (observability_test.go).
package observability
