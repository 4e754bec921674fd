package observe

import (
	"context"

	"github.com/ddp-agent/ddp-agent/agent/telemetry/watch"
	"github.com/ddp-agent/ddp-agent/nvml"
	"github.com/ddp-agent/ddp-agent/nvml/health"
)

// NewWatcher makes the health watcher of devs over the node's NVML.
type NewWatcher func(devs []health.Device, opts ...health.Option) *health.Watcher

// WatchGPUs runs a health watcher of devs, made by newWatcher with opts,
// until ctx is done or act returns false. act is handed each batch's
// findings that call for a restart of the workers or more, and decides
// what the mode does about them; the watcher logs the others. It returns
// at once without a watcher or devices.
func WatchGPUs(ctx context.Context, newWatcher NewWatcher, devs []health.Device, opts []health.Option, act func([]health.Finding) bool) {
	if newWatcher == nil || len(devs) == 0 {
		return
	}
	w := newWatcher(devs, opts...)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = w.Run(ctx)
	}()
	defer func() { <-done }()
	for {
		findings, err := w.Next(ctx)
		if err != nil {
			return
		}
		var serious []health.Finding
		for _, f := range findings {
			if f.Action >= health.ActionRestartWorkers {
				serious = append(serious, f)
			}
		}
		if len(serious) > 0 && !act(serious) {
			return
		}
	}
}

// ReadGPU is a Policy's ReadGPU over state, which reads a GPU's state
// now; nil without it.
func ReadGPU(state func(uuid string) (nvml.GPUState, error)) func(string) (watch.GPUReading, error) {
	if state == nil {
		return nil
	}
	return func(uuid string) (watch.GPUReading, error) {
		st, err := state(uuid)
		if err != nil {
			return watch.GPUReading{}, err
		}
		return watch.GPUReading{State: st.String(), Slowdown: st.Slowdown()}, nil
	}
}
