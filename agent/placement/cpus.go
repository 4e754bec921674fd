package placement

import (
	"fmt"
	"io/fs"
	"slices"

	"github.com/ddp-agent/ddp-agent/nvml"
)

// near returns the CPUs near GPU g and the NUMA node for its memory (-1
// when unknown): the CPUs of its NUMA node, or the GPU's own CPU affinity
// when the node is unknown or has no CPUs of its own listed.
func near(t *nvml.Topology, g int) (nvml.CPUList, int) {
	gpu := t.GPUs[g]
	if gpu.NUMANode >= 0 {
		for _, n := range t.Host.NUMANodes {
			if n.ID == gpu.NUMANode && len(n.CPUs) > 0 {
				return n.CPUs, n.ID
			}
		}
	}
	return gpu.CPUAffinity, gpu.NUMANode
}

// bindNode gives each worker with a GPU the CPUs near it and prefers its
// NUMA node's memory.
func (p *Plan) bindNode(t *nvml.Topology, allowed nvml.CPUList) {
	for i := range p.Workers {
		w := &p.Workers[i]
		if w.GPU < 0 {
			continue
		}
		cpus, node := near(t, w.GPU)
		if len(cpus) == 0 {
			p.notef("local rank %d: the CPUs near GPU %d are unknown: not bound", w.LocalRank, w.GPU)
			continue
		}
		mine := intersect(cpus, allowed)
		if len(mine) == 0 {
			p.notef("local rank %d: the CPUs near GPU %d (%s) are all outside the agent's own (%s): not bound",
				w.LocalRank, w.GPU, cpus, allowed)
			continue
		}
		w.CPUs, w.MemNode = mine, node
	}
}

// bindExclusive splits the physical cores near the GPUs among their
// workers: the workers whose GPUs share a NUMA node (or, with the node
// unknown, a CPU affinity) get disjoint contiguous runs of its cores in
// local-rank order, the first ones a core more when they do not divide
// evenly, each core with all its thread siblings; memory is bound to the
// node. Only the cores with CPUs the agent may use are shared out, so a
// cpuset covering part of a node still gives every worker some; whether
// there are enough cores at all depends on the node alone, though, so the
// same job on the same hardware fails or not alike.
func (p *Plan) bindExclusive(t *nvml.Topology, allowed nvml.CPUList, sysfs fs.FS) error {
	type domain struct {
		cpus    nvml.CPUList
		node    int
		workers []int // indexes into p.Workers, in local-rank order
	}
	var domains []*domain
	for i, w := range p.Workers {
		if w.GPU < 0 {
			continue
		}
		cpus, node := near(t, w.GPU)
		if len(cpus) == 0 {
			p.notef("local rank %d: the CPUs near GPU %d are unknown: not bound", w.LocalRank, w.GPU)
			continue
		}
		at := slices.IndexFunc(domains, func(d *domain) bool { return d.node == node && slices.Equal(d.cpus, cpus) })
		if at < 0 {
			domains = append(domains, &domain{cpus: cpus, node: node})
			at = len(domains) - 1
		}
		domains[at].workers = append(domains[at].workers, i)
	}

	for _, d := range domains {
		cores := physicalCores(sysfs, d.cpus)
		if len(cores) < len(d.workers) {
			where := fmt.Sprintf("NUMA node %d", d.node)
			if d.node < 0 {
				where = "CPUs " + d.cpus.String()
			}
			return fmt.Errorf("exclusive binding: %s has %d physical cores for %d workers", where, len(cores), len(d.workers))
		}
		var usable []nvml.CPUList
		for _, c := range cores {
			if c = intersect(c, allowed); len(c) > 0 {
				usable = append(usable, c)
			}
		}
		for k, share := range split(usable, len(d.workers)) {
			w := &p.Workers[d.workers[k]]
			if len(share) == 0 {
				p.notef("local rank %d: no core near GPU %d (%s) is left within the agent's own CPUs (%s): not bound",
					w.LocalRank, w.GPU, d.cpus, allowed)
				continue
			}
			w.CPUs, w.MemNode, w.StrictMem = share, d.node, d.node >= 0
		}
	}
	return nil
}

// split deals cores out in n contiguous shares, the first len(cores)%n
// shares one core larger; a share is the CPUs of its cores, nil when
// there are fewer cores than shares.
func split(cores []nvml.CPUList, n int) []nvml.CPUList {
	shares := make([]nvml.CPUList, n)
	base, extra := len(cores)/n, len(cores)%n
	next := 0
	for k := range shares {
		size := base
		if k < extra {
			size++
		}
		for _, c := range cores[next : next+size] {
			shares[k] = append(shares[k], c...)
		}
		slices.Sort(shares[k])
		next += size
	}
	return shares
}

// physicalCores groups cpus into physical cores by their thread siblings
// in sysfs, in order of each core's lowest CPU. A CPU whose siblings
// cannot be read is a core of its own.
func physicalCores(sysfs fs.FS, cpus nvml.CPUList) []nvml.CPUList {
	var cores []nvml.CPUList
	taken := map[int]bool{}
	for _, c := range cpus {
		if taken[c] {
			continue
		}
		core := nvml.CPUList{c}
		if sib, ok := siblings(sysfs, c); ok {
			core = union(core, intersect(sib, cpus))
		}
		core = slices.DeleteFunc(core, func(s int) bool { return taken[s] })
		for _, s := range core {
			taken[s] = true
		}
		cores = append(cores, core)
	}
	return cores
}

// siblings reads the hardware threads sharing a core with cpu.
func siblings(sysfs fs.FS, cpu int) (nvml.CPUList, bool) {
	if sysfs == nil {
		return nil, false
	}
	b, err := fs.ReadFile(sysfs, fmt.Sprintf("devices/system/cpu/cpu%d/topology/thread_siblings_list", cpu))
	if err != nil {
		return nil, false
	}
	l, err := nvml.ParseCPUList(string(b))
	if err != nil {
		return nil, false
	}
	return l, true
}

// intersect is the CPUs in both a and b; b nil means no restriction.
func intersect(a, b nvml.CPUList) nvml.CPUList {
	if b == nil {
		return slices.Clone(a)
	}
	var out nvml.CPUList
	for _, c := range a {
		if _, ok := slices.BinarySearch(b, c); ok {
			out = append(out, c)
		}
	}
	return out
}

func union(a, b nvml.CPUList) nvml.CPUList {
	out := append(slices.Clone(a), b...)
	slices.Sort(out)
	return slices.Compact(out)
}
