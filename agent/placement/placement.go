// Package placement decides where each worker of a node runs: which GPU,
// in which CUDA device order, and on which CPUs and NUMA memory node. New
// computes a Plan from the node's topology; the agent applies it with
// Plan.Env and, for a bound worker, by starting it through the __bind
// trampoline (Worker.Args, Exec). Plans are plain values: safe to read
// from several goroutines once built.
package placement

import (
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"

	"github.com/ddp-agent/ddp-agent/internal/envname"
	"github.com/ddp-agent/ddp-agent/nvml"
)

// Mode is --numa-binding: how workers are bound to the CPUs and memory
// near their GPU.
type Mode string

// Binding modes.
const (
	// ModeNone binds nothing.
	ModeNone Mode = "none"
	// ModeNode lets each worker run on all CPUs of its GPU's NUMA node and
	// prefer that node's memory; workers on one node share its CPUs.
	ModeNode Mode = "node"
	// ModeExclusive splits each NUMA node's physical cores among the
	// workers whose GPUs hang off it, and binds their memory strictly to
	// the node.
	ModeExclusive Mode = "exclusive"
)

// ParseMode reads a --numa-binding value.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeNone, ModeNode, ModeExclusive:
		return m, nil
	}
	return "", fmt.Errorf("numa binding %q: want one of %s, %s, %s", s, ModeNone, ModeNode, ModeExclusive)
}

// Input is what New places workers from.
type Input struct {
	// Topology is the node's GPUs and CPU layout; nil when the node has no
	// NVML (CPU-only). A topology without GPUs is treated alike.
	Topology *nvml.Topology
	// NProc is the number of workers on this node.
	NProc int
	// Mode is the binding; "" is ModeNone.
	Mode Mode
	// Visible is the agent's own CUDA_VISIBLE_DEVICES and VisibleSet
	// whether it is set. Entries are NVML indexes or GPU UUIDs ("GPU-...",
	// unique prefixes allowed as CUDA does); an entry that names no GPU is
	// an error, and "" set means no GPU is visible.
	Visible    string
	VisibleSet bool
	// Allowed are the CPUs the agent itself may run on (Affinity: cgroup
	// cpusets, taskset); bindings are intersected with it. Nil: no
	// restriction.
	Allowed nvml.CPUList
	// AllowedMems are the NUMA nodes the agent may allocate on
	// (MemsAllowed: the cpuset's mems); a memory policy for another node
	// is refused by the kernel, so it is dropped. Nil: no restriction.
	AllowedMems nvml.CPUList
	// SysFS is /sys (os.DirFS("/sys") in production), read for the CPUs'
	// thread siblings in exclusive mode. A CPU whose siblings cannot be
	// read (or a nil SysFS) counts as a core of its own.
	SysFS fs.FS
}

// Worker is where one local rank runs.
type Worker struct {
	LocalRank int
	// GPU is the worker's GPU (an NVML index) and UUID its UUID; GPU is -1
	// when the worker has no GPU of its own.
	GPU  int
	UUID string
	// CPUs is what the worker is bound to; nil when it is not bound.
	CPUs nvml.CPUList
	// MemNode is the NUMA node for the worker's memory, -1 for no memory
	// policy. StrictMem makes it MPOL_BIND (exclusive mode) instead of
	// MPOL_PREFERRED (node mode).
	MemNode   int
	StrictMem bool
}

// Plan is the placement of a node's workers.
type Plan struct {
	// Ring is the NVML indexes of the visible GPUs in ring order: CUDA
	// ordinal i is Ring[i]. With MIG enabled it is the visible GPUs in
	// the order given, and CUDA ordinals number MIG instances instead.
	Ring []int
	// Workers has one entry per local rank.
	Workers []Worker
	// Notes are things to log once: a worker left unbound, fewer GPUs than
	// workers, MIG.
	Notes []string

	// spell is each Ring entry as CUDA_VISIBLE_DEVICES should name it
	// (the user's own spelling when the agent's variable was set).
	spell []string
	// env is false when the plan leaves CUDA_VISIBLE_DEVICES alone.
	env  bool
	mode Mode
	// hops describes the ring's links for String.
	hops string
}

// New places in.NProc workers. It fails on a bad Input (no workers, an
// unknown mode, a CUDA_VISIBLE_DEVICES entry that names no GPU) and, in
// exclusive mode, when a NUMA node has fewer physical cores than workers;
// anything else that keeps a worker from being bound is a Note.
func New(in Input) (*Plan, error) {
	if in.NProc < 1 {
		return nil, fmt.Errorf("place %d workers: want at least one", in.NProc)
	}
	mode := in.Mode
	if mode == "" {
		mode = ModeNone
	}
	if _, err := ParseMode(string(mode)); err != nil {
		return nil, fmt.Errorf("place workers: %w", err)
	}
	p := &Plan{mode: mode, Workers: make([]Worker, in.NProc)}
	for i := range p.Workers {
		p.Workers[i] = Worker{LocalRank: i, GPU: -1, MemNode: -1}
	}
	t := in.Topology
	if t == nil || len(t.GPUs) == 0 {
		return p, nil
	}

	if e, ok := migEntry(in.Visible, in.VisibleSet); ok {
		p.notef("CUDA_VISIBLE_DEVICES names MIG instance %s: GPU placement and binding left to it", e)
		return p, nil
	}
	gpus, spell, err := resolveVisible(t, in.Visible, in.VisibleSet)
	if err != nil {
		return nil, err
	}
	for _, g := range gpus {
		if t.GPUs[g].MIG == nvml.MIGEnabled {
			// CUDA numbers the MIG instances, not the GPUs, and MIG
			// instances have no NVLink or P2P between them: neither the ring
			// nor a GPU per local rank means anything, so the plan keeps the
			// GPUs as given and leaves CUDA_VISIBLE_DEVICES alone.
			p.Ring = gpus
			p.notef("GPU %d has MIG enabled: GPU order, GPU per worker and binding left as they are", g)
			return p, nil
		}
	}
	if len(gpus) == 0 {
		p.notef("CUDA_VISIBLE_DEVICES is empty: no worker gets a GPU")
		return p, nil
	}

	// The ring is searched over the GPUs sorted by index, so that its
	// tie-break, the lexicographically smallest ring, is in NVML indexes
	// whatever order CUDA_VISIBLE_DEVICES listed them in.
	byIndex := make([]int, len(gpus))
	for i := range byIndex {
		byIndex[i] = i
	}
	slices.SortFunc(byIndex, func(a, b int) int { return gpus[a] - gpus[b] })
	sorted := make([]int, len(gpus))
	for k, i := range byIndex {
		sorted[k] = gpus[i]
	}
	order := ringOrder(linkScores(t, sorted))
	p.Ring = make([]int, len(order))
	p.spell = make([]string, len(order))
	for i, k := range order {
		p.Ring[i], p.spell[i] = gpus[byIndex[k]], spell[byIndex[k]]
	}
	p.env = true
	p.hops = hops(t, p.Ring)

	for i := range p.Workers {
		if i < len(p.Ring) {
			p.Workers[i].GPU = p.Ring[i]
			p.Workers[i].UUID = t.GPUs[p.Ring[i]].UUID
		}
	}
	if in.NProc > len(p.Ring) {
		p.notef("%d workers, %d GPUs: local ranks %s have no GPU of their own and are not bound",
			in.NProc, len(p.Ring), span(len(p.Ring), in.NProc-1))
	}

	switch mode {
	case ModeNode:
		p.bindNode(t, in.Allowed)
	case ModeExclusive:
		if err := p.bindExclusive(t, in.Allowed, in.SysFS); err != nil {
			return nil, err
		}
	}
	if in.AllowedMems != nil {
		p.dropForeignMems(in.AllowedMems)
	}
	return p, nil
}

// dropForeignMems takes the memory policy off workers whose node the agent
// may not allocate on (a container's or Slurm step's cpuset), where
// set_mempolicy would fail and the worker with it.
func (p *Plan) dropForeignMems(allowed nvml.CPUList) {
	var dropped []string
	for i := range p.Workers {
		w := &p.Workers[i]
		if w.MemNode >= 0 && !slices.Contains(allowed, w.MemNode) {
			dropped = append(dropped, strconv.Itoa(w.LocalRank))
			w.MemNode, w.StrictMem = -1, false
		}
	}
	if len(dropped) > 0 {
		p.notef("local ranks %s: their GPU's NUMA node is not among the memory nodes this agent may use (%s); their memory is not bound",
			strings.Join(dropped, ","), allowed)
	}
}

func (p *Plan) notef(format string, a ...any) {
	p.Notes = append(p.Notes, fmt.Sprintf(format, a...))
}

// Env is the environment the agent adds for the worker of local rank
// localRank: CUDA_VISIBLE_DEVICES is the ring, the same for every worker,
// so that a script's torch.cuda.set_device(LOCAL_RANK) lands on
// Ring[LOCAL_RANK]; CUDA_DEVICE_ORDER=PCI_BUS_ID makes indexes in it mean
// NVML's (only set when it has indexes); DDP_AGENT_GPU is the worker's own
// GPU's UUID. Empty without NVML, with no GPU visible, and with MIG.
func (p *Plan) Env(localRank int) map[string]string {
	env := map[string]string{}
	if !p.env {
		return env
	}
	env["CUDA_VISIBLE_DEVICES"] = strings.Join(p.spell, ",")
	for _, s := range p.spell {
		if !strings.HasPrefix(s, "GPU-") {
			env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
			break
		}
	}
	if localRank >= 0 && localRank < len(p.Workers) {
		if w := p.Workers[localRank]; w.GPU >= 0 && w.UUID != "" {
			env[envname.GPU] = w.UUID
		}
	}
	return env
}

// VirtualEnv is Env for torchrun's --virtual-local-rank: the worker sees
// its own GPU alone, as device 0 (its LOCAL_RANK is 0).
func (p *Plan) VirtualEnv(localRank int) map[string]string {
	env := p.Env(localRank)
	if p.env && localRank >= 0 && localRank < len(p.spell) {
		env["CUDA_VISIBLE_DEVICES"] = p.spell[localRank]
	}
	return env
}

// String is the plan in one line for the log: "ring 0,1,2,3 (NV12 all
// pairs); numa-binding node: 0:0-15@0 1:0-15@0 ...", each worker's CPUs
// followed by its memory node, "-" for a worker not bound to CPUs.
func (p *Plan) String() string {
	var b strings.Builder
	switch {
	case len(p.Ring) == 0:
		b.WriteString("no GPUs")
	default:
		b.WriteString("ring ")
		b.WriteString(joinInts(p.Ring))
		if p.hops != "" {
			b.WriteString(" (" + p.hops + ")")
		}
	}
	bound := false
	for _, w := range p.Workers {
		bound = bound || len(w.CPUs) > 0 || w.MemNode >= 0
	}
	if !bound {
		b.WriteString("; no binding")
		return b.String()
	}
	fmt.Fprintf(&b, "; numa-binding %s:", p.mode)
	for _, w := range p.Workers {
		fmt.Fprintf(&b, " %d:", w.LocalRank)
		switch {
		case len(w.CPUs) > 0:
			b.WriteString(w.CPUs.String())
		default:
			b.WriteString("-")
		}
		if w.MemNode >= 0 {
			b.WriteString("@" + strconv.Itoa(w.MemNode))
		}
	}
	return b.String()
}

// hops names the links of the ring: "NV12 all pairs" when every pair of
// its GPUs is linked alike, else each hop's class in ring order.
func hops(t *nvml.Topology, ring []int) string {
	if len(ring) < 2 {
		return ""
	}
	first := link(t, ring[0], ring[1]).Class()
	same := true
	for i, a := range ring {
		for _, b := range ring[i+1:] {
			same = same && link(t, a, b).Class() == first
		}
	}
	if same {
		return first + " all pairs"
	}
	classes := make([]string, len(ring))
	for i, a := range ring {
		classes[i] = link(t, a, ring[(i+1)%len(ring)]).Class()
	}
	return "hops " + strings.Join(classes, " ")
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

// span is "a" or "a-b".
func span(a, b int) string {
	if a == b {
		return strconv.Itoa(a)
	}
	return strconv.Itoa(a) + "-" + strconv.Itoa(b)
}
