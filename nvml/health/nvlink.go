package health

import (
	"fmt"
	"strings"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/ddp-agent/ddp-agent/nvml/internal/nvmlapi"
)

// nvlinkState is one NVLink of a GPU.
type nvlinkState struct {
	n           int
	up          bool
	counts      [gonvml.NVLINK_ERROR_COUNT]uint64
	seen        [gonvml.NVLINK_ERROR_COUNT]bool
	unsupported [gonvml.NVLINK_ERROR_COUNT]bool
}

var nvlinkCounterNames = [gonvml.NVLINK_ERROR_COUNT]string{"replay", "recovery", "crc-flit", "crc-data", "ecc-data"}

// probeNVLinks finds the NVLinks of g and whether each is up, the
// baseline of pollNVLink; without any, the check is dropped for g.
func (w *Watcher) probeNVLinks(g *watchedGPU) {
	p := &g.poll
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
		w.probeNVLinks(g)
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
