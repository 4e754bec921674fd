package observe

import "flag"

// Flags declares Config's flags on fs, with their defaults, and returns
// the check to call after fs.Parse, which reads the values with this
// package's parsers (options.go), as ddp-agent run's parser does. The
// flags' help says what the sidecar does on a hang.
func Flags(fs *flag.FlagSet, c *Config) (check func() error) {
	var hang, sample, cost string
	fs.StringVar(&hang, "hang-timeout", "60s", "a gradient all-reduce not finished this long after the first rank arrived is a hang: reported with the missing ranks' stacks, then the job's communicators here are aborted; auto: 60s, or 10 times the median step time when longer; 0 disables")
	fs.StringVar(&c.OTelEndpoint, "otel-endpoint", "", "OpenTelemetry collector for traces and metrics (host:port for OTLP/gRPC, or an http:// URL); default: the OTEL_EXPORTER_OTLP_* variables")
	fs.StringVar(&sample, "trace-sample", "0.1", "share of normal training steps traced (0 to 1); steps with a stall or hang are always traced")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", "", "serve the Prometheus metrics of every job at this address (e.g. :9464), each series labelled ddp_job_id")
	fs.StringVar(&cost, "straggler-cost", "0.05", "name a persistent straggler only when the waits it causes cost at least this share of step time (0 to 1, exclusive)")
	return func() (err error) {
		if c.HangTimeout, c.HangAuto, err = ParseHangTimeout(hang); err != nil {
			return err
		}
		if err := CheckMetricsAddr(c.MetricsAddr); err != nil {
			return err
		}
		if err := CheckOTelEndpoint(c.OTelEndpoint); err != nil {
			return err
		}
		if c.TraceSample, err = ParseTraceSample(sample); err != nil {
			return err
		}
		c.StragglerCost, err = ParseStragglerCost(cost)
		return err
	}
}
