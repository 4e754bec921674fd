package observe

import (
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry/export"
)

// The telemetry options' values, read the same way by both modes: the
// sidecar's flags (Flags) and ddp-agent run's torchrun-style parser
// (package launch), which declares its own help since the two modes act
// differently on a hang. The errors name the flag, so either parser can
// show them as they are.

// DefaultHangTimeout is --hang-timeout's default, and auto's floor.
const DefaultHangTimeout = time.Minute

// ParseHangTimeout reads --hang-timeout: auto (DefaultHangTimeout, or 10
// times the median step when longer), 0 (off), or a duration of a second
// or more, in seconds or as Go writes it (90s, 1m30s).
func ParseHangTimeout(v string) (d time.Duration, auto bool, err error) {
	if v == "auto" {
		return DefaultHangTimeout, true, nil
	}
	d, err = Seconds("hang-timeout", v)
	if err != nil {
		return 0, false, err
	}
	if d > 0 && d < time.Second {
		return 0, false, fmt.Errorf("--hang-timeout %v is below a second: healthy collectives would look hung (0 disables it)", d)
	}
	return d, false, nil
}

// CheckMetricsAddr checks --metrics-addr, a host:port to listen on ("" is
// none): a malformed one is the command line's mistake, said before
// anything starts, not a listener's failure at run time.
func CheckMetricsAddr(v string) error {
	if v == "" {
		return nil
	}
	_, port, err := net.SplitHostPort(v)
	if err != nil {
		return fmt.Errorf("--metrics-addr %q is not host:port or :port (e.g. :9464)", v)
	}
	// A number from 0 to 65535, or a service name (:http), as net.Listen takes.
	if _, err := net.LookupPort("tcp", port); err != nil {
		return fmt.Errorf("--metrics-addr %q: the port must be a number from 0 to 65535, or a service name", v)
	}
	return nil
}

// CheckOTelEndpoint checks --otel-endpoint and the OTEL_* variables that
// the exporters read (export.CheckEndpoint), before anything starts.
func CheckOTelEndpoint(v string) error {
	return export.CheckEndpoint(v)
}

// ParseTraceSample reads --trace-sample, a share from 0 to 1.
func ParseTraceSample(v string) (float64, error) {
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f < 0 || f > 1 {
		return 0, fmt.Errorf("--trace-sample must be a number from 0 to 1, got %q", v)
	}
	return f, nil
}

// ParseStragglerCost reads --straggler-cost, a share of step time above 0
// and below 1.
func ParseStragglerCost(v string) (float64, error) {
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || !(f > 0 && f < 1) {
		return 0, fmt.Errorf("--straggler-cost must be a share of step time between 0 and 1 (exclusive), got %q", v)
	}
	return f, nil
}

// Seconds reads flag --name's duration of 0 or more: seconds as a number
// (torchrun's way), or as Go writes it (500ms, 1m30s).
func Seconds(name, v string) (time.Duration, error) {
	if f, err := strconv.ParseFloat(v, 64); err == nil && f >= 0 {
		return time.Duration(f * float64(time.Second)), nil
	}
	if d, err := time.ParseDuration(v); err == nil && d >= 0 {
		return d, nil
	}
	return 0, fmt.Errorf("--%s must be a duration (seconds, or like 500ms), got %q", name, v)
}
