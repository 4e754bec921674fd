package placement

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/ddp-agent/ddp-agent/nvml"
)

// entries splits a CUDA_VISIBLE_DEVICES value; "" has none. A negative
// index ends the list, as in CUDA: "-1" is the usual way to hide every
// GPU from a process, and "NoDevFiles" is what Slurm sets for a job
// without GPUs.
func entries(value string) []string {
	if strings.TrimSpace(value) == "" {
		return nil
	}
	parts := strings.Split(value, ",")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
		if n, err := strconv.Atoi(parts[i]); (err == nil && n < 0) || parts[i] == "NoDevFiles" {
			return parts[:i]
		}
	}
	return parts
}

// VisibleCount is how many devices a CUDA_VISIBLE_DEVICES value names, as
// CUDA counts them: for MIG instances, which the topology cannot resolve.
func VisibleCount(value string) int { return len(entries(value)) }

// migEntry returns the first entry of the value that names a MIG
// instance ("MIG-<uuid>", or the older "MIG-GPU-<uuid>/gi/ci"). NVML's
// topology has no such entries to resolve them against.
func migEntry(value string, set bool) (string, bool) {
	if !set {
		return "", false
	}
	for _, e := range entries(value) {
		if strings.HasPrefix(e, "MIG-") {
			return e, true
		}
	}
	return "", false
}

// resolveVisible returns the GPUs (NVML indexes) that CUDA_VISIBLE_DEVICES
// makes visible, in its order, each with the entry that named it. Unset,
// every GPU is visible and named by its index. Unlike CUDA, which quietly
// ignores everything from the first bad entry on, a bad entry is an
// error: a typo would otherwise hide GPUs from the job.
func resolveVisible(t *nvml.Topology, value string, set bool) (gpus []int, spell []string, err error) {
	if !set {
		for i := range t.GPUs {
			gpus = append(gpus, i)
			spell = append(spell, strconv.Itoa(i))
		}
		return gpus, spell, nil
	}
	seen := map[int]string{}
	for _, e := range entries(value) {
		g, err := resolveEntry(t, e)
		if err != nil {
			return nil, nil, fmt.Errorf("CUDA_VISIBLE_DEVICES=%q: %w", value, err)
		}
		if prev, dup := seen[g]; dup {
			return nil, nil, fmt.Errorf("CUDA_VISIBLE_DEVICES=%q: %q and %q both name GPU %d", value, prev, e, g)
		}
		seen[g] = e
		gpus = append(gpus, g)
		spell = append(spell, e)
	}
	return gpus, spell, nil
}

// resolveEntry finds the GPU one entry names: an NVML index, or a GPU
// UUID or a prefix of one that only one GPU has.
func resolveEntry(t *nvml.Topology, e string) (int, error) {
	if strings.HasPrefix(e, "GPU-") {
		found := -1
		for i, g := range t.GPUs {
			if g.UUID == "" || !strings.HasPrefix(g.UUID, e) {
				continue
			}
			if found >= 0 {
				return 0, fmt.Errorf("entry %q is ambiguous: GPUs %d and %d both have UUIDs starting with it", e, found, i)
			}
			found = i
		}
		if found < 0 {
			return 0, fmt.Errorf("entry %q names no GPU: no GPU of this node has such a UUID", e)
		}
		return found, nil
	}
	i, err := strconv.Atoi(e)
	if err != nil {
		return 0, fmt.Errorf("entry %q names no GPU: want a GPU index or UUID (GPU-...)", e)
	}
	if i < 0 || i >= len(t.GPUs) {
		return 0, fmt.Errorf("entry %q names no GPU: this node has GPUs %s", e, span(0, len(t.GPUs)-1))
	}
	return i, nil
}
