package observe

import (
	"flag"
	"fmt"
	"strconv"
	"time"
)

// Flags declares Config's flags on fs, with their defaults, and returns
// the check to call after fs.Parse: it reads --hang-timeout (a duration,
// seconds, auto, or 0) into c and refuses values out of range. The flags'
// help says what the sidecar does on a hang; ddp-agent run reads the same
// options with torchrun's parser (package launch) and maps them onto a
// Config.
func Flags(fs *flag.FlagSet, c *Config) (check func() error) {
	var hang string
	fs.StringVar(&hang, "hang-timeout", "60s", "a gradient all-reduce not finished this long after the first rank arrived is a hang: reported with the missing ranks' stacks, then the job's communicators here are aborted; auto: 60s, or 10 times the median step time when longer; 0 disables")
	fs.StringVar(&c.OTelEndpoint, "otel-endpoint", "", "OpenTelemetry collector for traces and metrics (host:port for OTLP/gRPC, or an http:// URL); default: the OTEL_EXPORTER_OTLP_* variables")
	fs.Float64Var(&c.TraceSample, "trace-sample", 0.1, "share of normal training steps traced (0 to 1); steps with a stall or hang are always traced")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", "", "serve the Prometheus metrics of every job at this address (e.g. :9464), each series labelled ddp_job_id")
	fs.Float64Var(&c.StragglerCost, "straggler-cost", 0.05, "name a persistent straggler only when the waits it causes cost at least this share of step time (0 to 1, exclusive)")
	return func() error {
		switch hang {
		case "auto":
			c.HangTimeout, c.HangAuto = 60*time.Second, true
		case "0", "0s":
		default:
			d, err := positiveSeconds(hang)
			if err != nil {
				return fmt.Errorf("--hang-timeout: %w", err)
			}
			if d > 0 && d < time.Second {
				return fmt.Errorf("--hang-timeout %v is below a second: healthy collectives would look hung (0 disables it)", d)
			}
			c.HangTimeout = d
		}
		switch {
		case c.TraceSample < 0 || c.TraceSample > 1:
			return fmt.Errorf("--trace-sample %v: want 0 to 1", c.TraceSample)
		case c.StragglerCost <= 0 || c.StragglerCost >= 1:
			return fmt.Errorf("--straggler-cost %v: want more than 0 and less than 1", c.StragglerCost)
		}
		return nil
	}
}

// positiveSeconds reads a positive duration: seconds as a number, or a Go
// duration.
func positiveSeconds(v string) (time.Duration, error) {
	if s, err := strconv.ParseFloat(v, 64); err == nil && s > 0 {
		return time.Duration(s * float64(time.Second)), nil
	}
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return d, nil
	}
	return 0, fmt.Errorf("%q is not a positive duration (seconds, or like 500ms)", v)
}
