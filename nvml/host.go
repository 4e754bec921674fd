package nvml

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/shirou/gopsutil/v3/cpu"
)

// HostInfo is the node's CPU and NUMA layout, what the GPUs' affinities
// refer to and what workers are bound to.
type HostInfo struct {
	Hostname string `json:"hostname,omitempty"`
	// CPUModel is the CPU's model name as /proc/cpuinfo gives it.
	CPUModel string `json:"cpu_model,omitempty"`
	// Sockets, Cores (physical, all sockets) and CPUs (logical) are 0 when
	// unknown.
	Sockets int `json:"sockets"`
	Cores   int `json:"cores"`
	CPUs    int `json:"cpus"`
	// OnlineCPUs is /sys/devices/system/cpu/online.
	OnlineCPUs CPUList `json:"online_cpus"`
	// NUMANodes are the kernel's NUMA nodes that have CPUs or memory, by
	// id; empty when the kernel reports none (no NUMA support).
	NUMANodes []NUMANode `json:"numa_nodes"`
}

// NUMANode is one NUMA node.
type NUMANode struct {
	ID   int     `json:"id"`
	CPUs CPUList `json:"cpus"`
	// MemoryTotal is the node's memory in bytes, 0 when unknown.
	MemoryTotal uint64 `json:"memory_total_bytes"`
}

// cpuFacts is what gopsutil tells about the CPUs.
type cpuFacts struct {
	model                string
	sockets, cores, cpus int
}

// gopsutilCPUFacts reads /proc/cpuinfo and /sys through gopsutil.
func gopsutilCPUFacts(ctx context.Context) (cpuFacts, error) {
	var f cpuFacts
	var errs []error
	infos, err := cpu.InfoWithContext(ctx)
	if err != nil {
		errs = append(errs, fmt.Errorf("cpu info: %w", err))
	}
	sockets := map[string]bool{}
	for _, in := range infos {
		if f.model == "" {
			f.model = strings.TrimSpace(in.ModelName)
		}
		if in.PhysicalID != "" {
			sockets[in.PhysicalID] = true
		}
	}
	f.sockets = len(sockets)
	if f.cores, err = cpu.CountsWithContext(ctx, false); err != nil {
		errs = append(errs, fmt.Errorf("physical cores: %w", err))
	}
	if f.cpus, err = cpu.CountsWithContext(ctx, true); err != nil {
		errs = append(errs, fmt.Errorf("logical CPUs: %w", err))
	}
	return f, errors.Join(errs...)
}

// DiscoverHost reads the CPU layout (gopsutil) and the NUMA nodes
// (/sys/devices/system/node/node*/cpulist and meminfo). It returns what
// it could read, and an error naming what it could not; a kernel without
// NUMA nodes is not an error. ctx bounds gopsutil's reads.
func DiscoverHost(ctx context.Context, opts ...Option) (HostInfo, error) {
	o := newTopoOptions(opts)
	h := HostInfo{OnlineCPUs: CPUList{}, NUMANodes: []NUMANode{}}
	var errs []error
	h.Hostname, _ = os.Hostname()
	f, err := o.cpuFacts(ctx)
	if err != nil {
		errs = append(errs, err)
	}
	h.CPUModel, h.Sockets, h.Cores, h.CPUs = f.model, f.sockets, f.cores, f.cpus

	if b, err := fs.ReadFile(o.sysfs, "devices/system/cpu/online"); err == nil {
		if h.OnlineCPUs, err = ParseCPUList(string(b)); err != nil {
			errs = append(errs, err)
			h.OnlineCPUs = CPUList{}
		}
	} else {
		errs = append(errs, fmt.Errorf("online CPUs: %w", err))
	}
	if h.CPUs == 0 {
		h.CPUs = len(h.OnlineCPUs)
	}

	entries, err := fs.ReadDir(o.sysfs, "devices/system/node")
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, fmt.Errorf("NUMA nodes: %w", err))
	}
	for _, e := range entries {
		id, err := strconv.Atoi(strings.TrimPrefix(e.Name(), "node"))
		if !strings.HasPrefix(e.Name(), "node") || err != nil {
			continue
		}
		dir := "devices/system/node/" + e.Name()
		node := NUMANode{ID: id, CPUs: CPUList{}}
		if b, err := fs.ReadFile(o.sysfs, dir+"/cpulist"); err == nil {
			if node.CPUs, err = ParseCPUList(string(b)); err != nil {
				errs = append(errs, fmt.Errorf("NUMA node %d: %w", id, err))
				node.CPUs = CPUList{}
			}
		} else {
			errs = append(errs, fmt.Errorf("NUMA node %d: %w", id, err))
		}
		if b, err := fs.ReadFile(o.sysfs, dir+"/meminfo"); err == nil {
			node.MemoryTotal = nodeMemTotal(b)
		}
		h.NUMANodes = append(h.NUMANodes, node)
	}
	slices.SortFunc(h.NUMANodes, func(a, b NUMANode) int { return a.ID - b.ID })
	return h, errors.Join(errs...)
}

// nodeMemTotal reads "Node 0 MemTotal:       16314204 kB" from a node's
// meminfo.
func nodeMemTotal(meminfo []byte) uint64 {
	sc := bufio.NewScanner(bytes.NewReader(meminfo))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 4 && f[2] == "MemTotal:" {
			kb, err := strconv.ParseUint(f[3], 10, 64)
			if err != nil {
				return 0
			}
			return kb * 1024
		}
	}
	return 0
}
