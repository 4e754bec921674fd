//go:build nvmlmock

package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/ddp-agent/ddp-agent/internal/envname"
	"github.com/ddp-agent/ddp-agent/nvml"
	"github.com/ddp-agent/ddp-agent/nvml/nvmltest"
)

// mockThrottleEnv lists the GPUs (indices, comma-separated) that the mock
// shows throttled: "hw slowdown" with the SM clock at half its maximum
// while busy.
const mockThrottleEnv = envname.MockThrottle

// openNVML, in a build with the nvmlmock tag, is go-nvml's mock of a DGX
// A100 (eight A100s, busy, healthy, their health polls quiet) instead of
// the machine's NVML: for benchmarks that need the agent to see a GPU in a
// given state on a machine without one (examples/bench/stragglers'
// throttled-GPU scenario). Never in a release: the Makefile builds it as
// bin/ddp-agent-nvmlmock only. Run its workers with --numa-binding none:
// the DGX's CPUs are not this machine's.
func openNVML(getenv func(string) string) (*nvml.Lib, []nvml.Option, error) {
	srv := nvmltest.DGXA100(false)
	nvmltest.QuietPolls(srv)
	tel := nvmltest.NewTelemetry(srv)
	if list := getenv(mockThrottleEnv); list != "" {
		for _, f := range strings.Split(list, ",") {
			i, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || i < 0 || i >= len(srv.Devices) {
				return nil, nil, fmt.Errorf("%s=%q: want GPU indices 0..%d", mockThrottleEnv, list, len(srv.Devices)-1)
			}
			tel.Update(i, func(g *nvmltest.GPUTelemetry) {
				g.ClocksEventReasons = nvmltest.ThrottleHwSlowdown
				g.SMClockMHz = g.MaxSMClockMHz / 2
			})
		}
	}
	return nvmltest.Lib(srv), []nvml.Option{nvml.WithSysFS(nvmltest.DGXSysFS())}, nil
}
