package nvml

import (
	"fmt"
	"strconv"
	"strings"
)

// Summary is t in one line, for logs and `ddp-agent status`: the GPUs by
// model, how they are linked, and the driver. "8× NVIDIA A100-SXM4-40GB,
// NVSwitch (NV12), driver 550.54.15, CUDA 12.4"; "no GPUs" when NVML
// found none.
func (t *Topology) Summary() string {
	if t == nil || len(t.GPUs) == 0 {
		return "no GPUs"
	}
	var models []string
	count := map[string]int{}
	for _, g := range t.GPUs {
		name := g.Name
		if name == "" {
			name = "unknown GPU"
		}
		if count[name] == 0 {
			models = append(models, name)
		}
		count[name]++
	}
	parts := make([]string, 0, len(models)+3)
	for _, m := range models {
		parts = append(parts, strconv.Itoa(count[m])+"× "+m)
	}
	parts = append(parts, t.linkSummary())
	if t.Driver != "" {
		parts = append(parts, "driver "+t.Driver)
	}
	if t.CUDA != "" {
		parts = append(parts, "CUDA "+t.CUDA)
	}
	return strings.Join(parts, ", ")
}

// linkSummary names the links between the GPUs: the NVLink fabric and the
// fewest links of any pair, or the farthest PCIe path when some pair has
// no NVLink.
func (t *Topology) linkSummary() string {
	if len(t.GPUs) == 1 {
		return "1 GPU"
	}
	minNV, pairs, nvPairs := -1, 0, 0
	far := PathSelf
	order := map[PathClass]int{PathSelf: 0, PathPIX: 1, PathPXB: 2, PathPHB: 3, PathNODE: 4, PathSYS: 5, "": 6}
	for i := range t.Links {
		for j := i + 1; j < len(t.Links[i]); j++ {
			l := t.Links[i][j]
			pairs++
			if l.NVLinks > 0 {
				nvPairs++
				if minNV < 0 || l.NVLinks < minNV {
					minNV = l.NVLinks
				}
			}
			if order[l.PCIe] > order[far] {
				far = l.PCIe
			}
		}
	}
	switch {
	case nvPairs == pairs && t.NVSwitch:
		return fmt.Sprintf("NVSwitch (NV%d)", minNV)
	case nvPairs == pairs:
		return fmt.Sprintf("NVLink between all pairs (NV%d or more)", minNV)
	case nvPairs > 0:
		return fmt.Sprintf("NVLink between %d of %d pairs, PCIe up to %s", nvPairs, pairs, orNA(string(far)))
	}
	return "PCIe only, up to " + orNA(string(far))
}
