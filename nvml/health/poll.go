package health

import (
	"context"
	"fmt"
	"strings"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/ddp-agent/ddp-agent/nvml/internal/nvmlapi"
)

// The polled checks, by name. Each is dropped for a GPU the first time NVML
// says it is not supported there.
const (
	checkRecovery     = "recovery-action"
	checkRetiredPages = "retired-pages"
	checkRemappedRows = "remapped-rows"
	checkClocks       = "clocks-event-reasons"
	checkTemperature  = "temperature"
	checkNVLink       = "nvlink"
	checkPCIe         = "pcie-replay"
)

// NVML functions newer than the oldest drivers; the watcher asks the loaded
// library for them before it calls them (see nvmlapi.HasSymbol).
const (
	symFieldValues       = "nvmlDeviceGetFieldValues"
	symRetiredPending    = "nvmlDeviceGetRetiredPagesPendingStatus"
	symRemappedRows      = "nvmlDeviceGetRemappedRows"
	symClocksEvent       = "nvmlDeviceGetCurrentClocksEventReasons"
	symClocksThrottle    = "nvmlDeviceGetCurrentClocksThrottleReasons"
	symTemperature       = "nvmlDeviceGetTemperature"
	symTempThreshold     = "nvmlDeviceGetTemperatureThreshold"
	symNvLinkState       = "nvmlDeviceGetNvLinkState"
	symNvLinkErrorCounts = "nvmlDeviceGetNvLinkErrorCounter"
	symPcieReplay        = "nvmlDeviceGetPcieReplayCounter"
)

var newerSymbols = []string{
	symFieldValues, symRetiredPending, symRemappedRows, symClocksEvent, symClocksThrottle,
	symTemperature, symTempThreshold, symNvLinkState, symNvLinkErrorCounts, symPcieReplay,
}

// pollState is what the poll loop remembers about one GPU.
type pollState struct {
	unsupported map[string]bool          // checks dropped for this GPU
	failing     map[string]gonvml.Return // checks failing now, and how (logged once per run of failures)

	pagesPending bool   // retired pages pending (GPUs before Ampere)
	remapPending bool   // row remapping pending (Ampere and newer)
	remapFailed  bool   // row remapping failed
	slowdown     uint64 // slowdown clock-event reasons active at the last poll
	tempLimit    uint32 // 0 until the first temperature poll
	hot          bool
	links        []nvlinkState // nil until NVLink is probed
	pcieReplay   int
	pcieSeen     bool
}

// pollLoop polls every GPU now and then every interval, until ctx is done.
func (w *Watcher) pollLoop(ctx context.Context, gpus []*watchedGPU) {
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		for _, g := range gpus {
			if ctx.Err() != nil {
				return
			}
			w.poll(g)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// poll runs every check still enabled for g.
func (w *Watcher) poll(g *watchedGPU) {
	p := &g.poll
	if p.unsupported == nil {
		p.unsupported = map[string]bool{}
		p.failing = map[string]gonvml.Return{}
	}
	for _, c := range []struct {
		name string
		fn   func(*watchedGPU)
	}{
		{checkRecovery, w.pollRecovery},
		{checkRetiredPages, w.pollRetiredPages},
		{checkRemappedRows, w.pollRemappedRows},
		{checkClocks, w.pollClocks},
		{checkTemperature, w.pollTemperature},
		{checkNVLink, w.pollNVLink},
		{checkPCIe, w.pollPCIe},
	} {
		if g.lost.Load() {
			return
		}
		if !p.unsupported[c.name] {
			c.fn(g)
		}
	}
}

// ok sorts the outcome of an NVML call made by check: true on success; on
// not-supported the check is dropped for g (one log line); a lost GPU is
// recorded; other errors are logged once per run of failures and retried
// at the next poll.
func (w *Watcher) ok(g *watchedGPU, check string, ret gonvml.Return) bool {
	p := &g.poll
	switch ret {
	case gonvml.SUCCESS:
		if prev, failing := p.failing[check]; failing {
			delete(p.failing, check)
			w.logger.Info("GPU health check works again", "gpu", g.Index, "uuid", g.UUID, "check", check, "after", prev.Error())
		}
		return true
	case gonvml.ERROR_NOT_SUPPORTED, gonvml.ERROR_FUNCTION_NOT_FOUND:
		w.drop(g, check, ret.Error())
	case gonvml.ERROR_GPU_IS_LOST:
		w.markLost(g, check)
	default:
		if p.failing[check] != ret {
			p.failing[check] = ret
			w.logger.Warn("GPU health check failed; retrying each poll", "gpu", g.Index, "uuid", g.UUID, "check", check, "err", ret.Error())
		}
	}
	return false
}

// drop stops check for g, with one log line.
func (w *Watcher) drop(g *watchedGPU, check, why string) {
	g.poll.unsupported[check] = true
	w.logger.Info("GPU health check not supported; dropped", "gpu", g.Index, "uuid", g.UUID, "check", check, "why", why)
}

// pollRetiredPages records pages pending retirement (GPUs before Ampere):
// they are retired only when the GPU is reset or the driver reloaded, and
// until then the bad page can fault again. NVIDIA, "Dynamic Page
// Retirement".
func (w *Watcher) pollRetiredPages(g *watchedGPU) {
	if !w.have(symRetiredPending) {
		w.drop(g, checkRetiredPages, symRetiredPending+" not in this driver")
		return
	}
	st, ret := nvmlapi.Call(g.dev.GetRetiredPagesPendingStatus)
	if !w.ok(g, checkRetiredPages, ret) {
		return
	}
	pending := st == gonvml.FEATURE_ENABLED
	if pending && !g.poll.pagesPending {
		// Pending repairs do not touch running work (as XID 63): a warning
		// for the operator, not a reason to stop the job.
		w.record(g, KindMemory, 0, ActionIgnore, "retired pages pending: reset the GPU when the job ends to retire them")
	}
	g.poll.pagesPending = pending
}

// pollRemappedRows records pending row remappings (Ampere and newer; they
// take effect at the next GPU reset) and remapping failures (an RMA
// condition). NVIDIA, "A100 GPU Memory Error Management".
func (w *Watcher) pollRemappedRows(g *watchedGPU) {
	if !w.have(symRemappedRows) {
		w.drop(g, checkRemappedRows, symRemappedRows+" not in this driver")
		return
	}
	type rows struct {
		corr, unc        int
		pending, failure bool
	}
	r, ret := nvmlapi.Call(func() (rows, gonvml.Return) {
		c, u, p, f, ret := g.dev.GetRemappedRows()
		return rows{c, u, p, f}, ret
	})
	if !w.ok(g, checkRemappedRows, ret) {
		return
	}
	if r.failure && !g.poll.remapFailed {
		w.record(g, KindMemory, 0, ActionDrainNode,
			fmt.Sprintf("row remapping failed (%d rows remapped for correctable, %d for uncorrectable errors): the GPU needs service", r.corr, r.unc))
	}
	if r.pending && !g.poll.remapPending {
		w.record(g, KindMemory, 0, ActionIgnore,
			fmt.Sprintf("row remapping pending (%d rows remapped for correctable, %d for uncorrectable errors): reset the GPU when the job ends to apply it", r.corr, r.unc))
	}
	g.poll.remapFailed, g.poll.remapPending = r.failure, r.pending
}

// The clock-event reasons that mean the GPU is slowed down by something
// other than its workload: hardware slowdown, thermal slowdown (software or
// hardware), power brake. Power capping and idle are normal.
const slowdownReasons = gonvml.ClocksThrottleReasonHwSlowdown | gonvml.ClocksEventReasonSwThermalSlowdown |
	gonvml.ClocksThrottleReasonHwThermalSlowdown | gonvml.ClocksThrottleReasonHwPowerBrakeSlowdown

var slowdownNames = []struct {
	bit  uint64
	name string
}{
	{gonvml.ClocksThrottleReasonHwSlowdown, "hw-slowdown"},
	{gonvml.ClocksThrottleReasonHwThermalSlowdown, "hw-thermal-slowdown"},
	{gonvml.ClocksEventReasonSwThermalSlowdown, "sw-thermal-slowdown"},
	{gonvml.ClocksThrottleReasonHwPowerBrakeSlowdown, "hw-power-brake"},
}

// pollClocks warns when a slowdown reason starts. It uses
// nvmlDeviceGetCurrentClocksEventReasons (R535 and newer) and falls back to
// its older name, ...ClocksThrottleReasons.
func (w *Watcher) pollClocks(g *watchedGPU) {
	read := g.dev.GetCurrentClocksEventReasons
	if !w.have(symClocksEvent) {
		if !w.have(symClocksThrottle) {
			w.drop(g, checkClocks, "no clock-event reasons in this driver")
			return
		}
		read = g.dev.GetCurrentClocksThrottleReasons
	}
	reasons, ret := nvmlapi.Call(read)
	if !w.ok(g, checkClocks, ret) {
		return
	}
	cur := reasons & slowdownReasons
	if started := cur &^ g.poll.slowdown; started != 0 {
		var names []string
		for _, r := range slowdownNames {
			if cur&r.bit != 0 {
				names = append(names, r.name)
			}
		}
		w.record(g, KindClocks, 0, ActionIgnore, "clocks slowed down: "+strings.Join(names, ", "))
	}
	g.poll.slowdown = cur
}

// pollTemperature warns when the GPU reaches the temperature limit, and
// again only after it has cooled 3 °C below it.
func (w *Watcher) pollTemperature(g *watchedGPU) {
	if !w.have(symTemperature) {
		w.drop(g, checkTemperature, symTemperature+" not in this driver")
		return
	}
	p := &g.poll
	if p.tempLimit == 0 {
		p.tempLimit = w.tempLimit
		if p.tempLimit == 0 && w.have(symTempThreshold) {
			t, ret := nvmlapi.Call(func() (uint32, gonvml.Return) {
				return g.dev.GetTemperatureThreshold(gonvml.TEMPERATURE_THRESHOLD_SLOWDOWN)
			})
			if ret == gonvml.SUCCESS && t > 5 {
				p.tempLimit = t - 5
			}
		}
		if p.tempLimit == 0 {
			p.tempLimit = 85
		}
	}
	t, ret := nvmlapi.Call(func() (uint32, gonvml.Return) { return g.dev.GetTemperature(gonvml.TEMPERATURE_GPU) })
	if !w.ok(g, checkTemperature, ret) {
		return
	}
	switch {
	case t >= p.tempLimit && !p.hot:
		p.hot = true
		w.record(g, KindTemperature, 0, ActionIgnore, fmt.Sprintf("GPU at %d °C, at or above the %d °C limit", t, p.tempLimit))
	case p.hot && t+3 < p.tempLimit:
		p.hot = false
		w.logger.Info("GPU health: temperature back below the limit", "gpu", g.Index, "uuid", g.UUID, "celsius", t, "limit", p.tempLimit)
	}
}

// pollPCIe warns when the PCIe replay counter grows: the link is retrying
// transfers, a sign of a marginal slot, riser or cable.
func (w *Watcher) pollPCIe(g *watchedGPU) {
	if !w.have(symPcieReplay) {
		w.drop(g, checkPCIe, symPcieReplay+" not in this driver")
		return
	}
	v, ret := nvmlapi.Call(g.dev.GetPcieReplayCounter)
	if !w.ok(g, checkPCIe, ret) {
		return
	}
	p := &g.poll
	if p.pcieSeen && v > p.pcieReplay {
		w.record(g, KindPCIe, 0, ActionIgnore, fmt.Sprintf("PCIe replays +%d within %s (%d in all)", v-p.pcieReplay, w.interval, v))
	}
	p.pcieReplay, p.pcieSeen = v, true
}
