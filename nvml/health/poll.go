package health

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
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

// nvlinkState is one NVLink of a GPU.
type nvlinkState struct {
	n           int
	up          bool
	counts      [gonvml.NVLINK_ERROR_COUNT]uint64
	seen        [gonvml.NVLINK_ERROR_COUNT]bool
	unsupported [gonvml.NVLINK_ERROR_COUNT]bool
}

var nvlinkCounterNames = [gonvml.NVLINK_ERROR_COUNT]string{"replay", "recovery", "crc-flit", "crc-data", "ecc-data"}

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

// pollRecovery reads the driver's GPU recovery action and records a change
// to anything but "none".
func (w *Watcher) pollRecovery(g *watchedGPU) {
	if !w.have(symFieldValues) {
		w.drop(g, checkRecovery, symFieldValues+" not in this driver")
		return
	}
	v, ret := w.recoveryValue(g)
	if !w.ok(g, checkRecovery, ret) {
		return
	}
	old := g.recovery.Swap(int64(v))
	switch {
	case old == int64(v):
	case v != uint64(gonvml.GPU_RECOVERY_ACTION_NONE):
		a, desc := recoveryAction(v)
		w.record(g, KindRecovery, 0, a, "GPU recovery action: "+desc)
	case old >= 0:
		w.logger.Info("GPU health: recovery action back to none", "gpu", g.Index, "uuid", g.UUID)
	}
}

// readRecovery reads the recovery action for an event (Xid 154,
// EventTypeGpuRecoveryAction). ok is false when it cannot be read.
func (w *Watcher) readRecovery(g *watchedGPU) (a Action, desc string, ok bool) {
	if g.dev == nil || !w.have(symFieldValues) {
		return ActionIgnore, "", false
	}
	v, ret := w.recoveryValue(g)
	if ret != gonvml.SUCCESS {
		return ActionIgnore, "", false
	}
	g.recovery.Store(int64(v))
	a, desc = recoveryAction(v)
	return a, desc, true
}

// recoveryValue reads NVML_FI_DEV_GET_GPU_RECOVERY_ACTION.
func (w *Watcher) recoveryValue(g *watchedGPU) (uint64, gonvml.Return) {
	vals := []gonvml.FieldValue{{FieldId: gonvml.FI_DEV_GET_GPU_RECOVERY_ACTION}}
	if ret := nvmlapi.CallRet(func() gonvml.Return { return g.dev.GetFieldValues(vals) }); ret != gonvml.SUCCESS {
		return 0, ret
	}
	if ret := gonvml.Return(vals[0].NvmlReturn); ret != gonvml.SUCCESS {
		return 0, ret
	}
	return fieldUint(vals[0]), gonvml.SUCCESS
}

// fieldUint decodes an integer field value.
func fieldUint(f gonvml.FieldValue) uint64 {
	b := f.Value[:]
	switch gonvml.ValueType(f.ValueType) {
	case gonvml.VALUE_TYPE_DOUBLE:
		return uint64(math.Float64frombits(binary.NativeEndian.Uint64(b)))
	case gonvml.VALUE_TYPE_UNSIGNED_INT, gonvml.VALUE_TYPE_SIGNED_INT:
		return uint64(binary.NativeEndian.Uint32(b))
	case gonvml.VALUE_TYPE_UNSIGNED_SHORT:
		return uint64(binary.NativeEndian.Uint16(b))
	default:
		return binary.NativeEndian.Uint64(b)
	}
}

// recoveryAction maps the driver's recovery action (nvmlDeviceGpuRecoveryAction_t)
// to ours. Meanings from NVIDIA, "A100 GPU Memory Error Management", "Error
// Recovery and Response Flags": reset → reset; node reboot → drain; drain
// P2P ("terminate related processes"; asked again, the driver then names
// the next step) → restart the workers; drain and reset (reduced capacity;
// running work is safe) → reset. Values newer than v0.13.0-1 (IMEX domain
// recovery, PCIe bus reset, system reboot) are beyond a GPU reset: drain.
func recoveryAction(v uint64) (Action, string) {
	switch gonvml.DeviceGpuRecoveryAction(v) {
	case gonvml.GPU_RECOVERY_ACTION_NONE:
		return ActionIgnore, "none"
	case gonvml.GPU_RECOVERY_ACTION_GPU_RESET:
		return ActionResetGPU, "GPU reset required"
	case gonvml.GPU_RECOVERY_ACTION_NODE_REBOOT:
		return ActionDrainNode, "node reboot required"
	case gonvml.GPU_RECOVERY_ACTION_DRAIN_P2P:
		return ActionRestartWorkers, "drain peer-to-peer traffic (stop the processes using the GPU)"
	case gonvml.GPU_RECOVERY_ACTION_DRAIN_AND_RESET:
		return ActionResetGPU, "reduced capacity: drain the work and reset the GPU"
	}
	return ActionDrainNode, fmt.Sprintf("recovery action %d (unknown to ddp-agent)", v)
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

// pollNVLink watches the NVLinks that were present at the first poll: a
// link that goes down asks for a GPU reset (as Xid 74); growing error
// counters warn, and past the limit within one interval ask for a reset.
func (w *Watcher) pollNVLink(g *watchedGPU) {
	if !w.have(symNvLinkState) || !w.have(symNvLinkErrorCounts) {
		w.drop(g, checkNVLink, "NVLink queries not in this driver")
		return
	}
	p := &g.poll
	if p.links == nil {
		for n := range gonvml.NVLINK_MAX_LINKS {
			st, ret := nvmlapi.Call(func() (gonvml.EnableState, gonvml.Return) { return g.dev.GetNvLinkState(n) })
			if ret == gonvml.ERROR_GPU_IS_LOST {
				w.markLost(g, checkNVLink)
				return
			}
			if ret == gonvml.SUCCESS {
				p.links = append(p.links, nvlinkState{n: n, up: st == gonvml.FEATURE_ENABLED})
			}
		}
		if len(p.links) == 0 {
			w.drop(g, checkNVLink, "no NVLink")
		}
		return // the first poll only takes the baseline
	}
	var deltas [gonvml.NVLINK_ERROR_COUNT]uint64
	var total uint64
	var errLinks, downLinks []string
	failed := gonvml.SUCCESS // the first error of this poll, reported once below
	for i := range p.links {
		l := &p.links[i]
		st, ret := nvmlapi.Call(func() (gonvml.EnableState, gonvml.Return) { return g.dev.GetNvLinkState(l.n) })
		if ret == gonvml.ERROR_GPU_IS_LOST {
			w.markLost(g, checkNVLink)
			return
		}
		if ret != gonvml.SUCCESS {
			if failed == gonvml.SUCCESS {
				failed = ret
			}
			continue
		}
		up := st == gonvml.FEATURE_ENABLED
		if l.up && !up {
			downLinks = append(downLinks, fmt.Sprint(l.n))
		}
		l.up = up
		if !up {
			continue
		}
		var linkTotal uint64
		for c := range gonvml.NVLINK_ERROR_COUNT {
			if l.unsupported[c] {
				continue
			}
			v, ret := nvmlapi.Call(func() (uint64, gonvml.Return) { return g.dev.GetNvLinkErrorCounter(l.n, c) })
			switch ret {
			case gonvml.SUCCESS:
			case gonvml.ERROR_NOT_SUPPORTED, gonvml.ERROR_FUNCTION_NOT_FOUND, gonvml.ERROR_INVALID_ARGUMENT:
				l.unsupported[c] = true
				continue
			case gonvml.ERROR_GPU_IS_LOST:
				w.markLost(g, checkNVLink)
				return
			default:
				continue
			}
			if l.seen[c] && v > l.counts[c] {
				d := v - l.counts[c]
				deltas[c] += d
				linkTotal += d
			}
			l.counts[c], l.seen[c] = v, true
		}
		if linkTotal > 0 {
			errLinks = append(errLinks, fmt.Sprint(l.n))
			total += linkTotal
		}
	}
	if !w.ok(g, checkNVLink, failed) && p.unsupported[checkNVLink] {
		return
	}
	if len(downLinks) > 0 {
		w.record(g, KindNVLink, 0, ActionResetGPU, "NVLink down: link "+strings.Join(downLinks, ", "))
	}
	if total > 0 {
		var parts []string
		for c, d := range deltas {
			if d > 0 {
				parts = append(parts, fmt.Sprintf("%s +%d", nvlinkCounterNames[c], d))
			}
		}
		action := ActionIgnore
		if total >= w.nvlinkLimit {
			action = ActionResetGPU
		}
		w.record(g, KindNVLink, 0, action, fmt.Sprintf("NVLink errors on link %s within %s: %s",
			strings.Join(errLinks, ", "), w.interval, strings.Join(parts, ", ")))
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
