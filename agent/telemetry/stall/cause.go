package stall

import (
	"fmt"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

// Explain names why st is slow, with the evidence: the phase that carries
// its lateness (phases.go), refined by what its node shows. gpu is NVML's
// slowdown of its GPU (nvml.GPUState.Slowdown), host its host's
// (hostmon.Slowdown); "" when nothing. It is a pure function of its
// arguments.
//
// A phase explains the lateness when it is at least half of it and at
// least twice either other phase: otherwise the cause is unknown, never a
// guess. Slow
// compute is the GPU's doing when NVML shows a slowdown, the host's when
// the rank's threads wait for a CPU, else the rank's own work (a bigger
// batch, a slower kernel, a check run on one rank). Without marks (a hook
// from before them) only a GPU or host slowdown says anything.
func Explain(st telemetry.Straggler, gpu, host string) (telemetry.Cause, string) {
	if st.Phased == 0 {
		switch {
		case gpu != "":
			return telemetry.CauseGPU, "its GPU: " + gpu + " (forward starts not marked: phases unknown)"
		case host != "":
			return telemetry.CauseHost, "its host: " + host + " (forward starts not marked: phases unknown)"
		}
		return telemetry.CauseUnknown, "forward starts not marked (the hook predates them): phases unknown"
	}
	phases := fmt.Sprintf("beyond the others' median over %d steps: input %s, compute %s, all-reduce %s",
		st.Phased, signed(st.Input), signed(st.Compute), signed(st.Comm))
	top, d, second := telemetry.CauseInput, st.Input, max(st.Compute, st.Comm)
	if st.Compute > d {
		top, d, second = telemetry.CauseCompute, st.Compute, max(st.Input, st.Comm)
	}
	if st.Comm > d {
		top, d, second = telemetry.CauseNetwork, st.Comm, max(st.Input, st.Compute)
	}
	if d <= 0 || d < st.Late/2 || d < 2*second {
		return telemetry.CauseUnknown, "no phase explains its lateness of " + st.Late.Round(time.Microsecond).String() + " (" + phases + ")"
	}
	switch top {
	case telemetry.CauseInput:
		return top, fmt.Sprintf("it starts forward %s after the others (loading data or work between steps; %s)", short(d), phases)
	case telemetry.CauseNetwork:
		return top, fmt.Sprintf("its all-reduces finish %s after the others' (%s)", short(d), phases)
	}
	switch {
	case gpu != "":
		return telemetry.CauseGPU, fmt.Sprintf("forward and backward take %s longer and its GPU is slowed: %s (%s)", short(d), gpu, phases)
	case host != "":
		return telemetry.CauseHost, fmt.Sprintf("forward and backward take %s longer and its host is contended: %s (%s)", short(d), host, phases)
	}
	return top, fmt.Sprintf("forward and backward take %s longer while its input time does not grow (%s)", short(d), phases)
}

// short rounds d for a sentence: "48ms", "1.2ms", "850µs".
func short(d time.Duration) string {
	switch {
	case d >= 10*time.Millisecond || d <= -10*time.Millisecond:
		return d.Round(time.Millisecond).String()
	case d >= time.Millisecond || d <= -time.Millisecond:
		return d.Round(100 * time.Microsecond).String()
	}
	return d.Round(time.Microsecond).String()
}

// signed is short with a sign: "+48ms", "-1.2ms", "+0s".
func signed(d time.Duration) string {
	if d < 0 {
		return short(d)
	}
	return "+" + short(d)
}
