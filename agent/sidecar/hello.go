package sidecar

import (
	"fmt"
	"strconv"

	"github.com/ddp-agent/ddp-agent/wire"
)

// worker is what a Hello says of a worker and its job, checked.
type worker struct {
	job        string
	gen        uint64
	rank       int
	localRank  int
	world      int
	localWorld int
	groupRank  int
	masterAddr string
	relay      string // the leading sidecar's relay endpoint, from rank 0's hook; "" none
	gpu        string
	stackDir   string
}

// offset is the global rank of this worker's node's local rank 0.
func (w worker) offset() int { return w.rank - w.localRank }

// nnodes is the job's node count, the launcher's nodes being alike
// (torchrun's --nproc-per-node is one number).
func (w worker) nnodes() int { return (w.world + w.localWorld - 1) / w.localWorld }

// Bounds on what one Hello may make the sidecar hold: a same-user process
// can send any Hello, and the sidecar must not grow to the point where the
// kernel's OOM killer picks a training worker.
const (
	maxWorld      = 1 << 17 // ranks in a job
	maxLocalWorld = 1024    // workers of a job on one node
	maxField      = 4096    // bytes of a string field (a path, an endpoint)
	maxJobID      = 256
)

// parseHello checks a sidecar's Hello: a job, sizes that hold together,
// ranks inside them. It is pure, for tests.
func parseHello(h wire.Hello) (worker, error) {
	j := h.Job
	w := worker{job: j[wire.HelloJob], gen: h.Generation, rank: int(h.Rank), localRank: int(h.LocalRank),
		masterAddr: j[wire.HelloMasterAddr], relay: j[wire.HelloRelay], gpu: j[wire.HelloGPU], stackDir: j[wire.HelloStackDir]}
	if w.job == "" {
		return worker{}, fmt.Errorf("hello names no job (Hello.Job[%q]): is this ddp_agent older than the sidecar?", wire.HelloJob)
	}
	if len(w.job) > maxJobID {
		return worker{}, fmt.Errorf("job id of %d bytes, over %d", len(w.job), maxJobID)
	}
	for k, v := range j {
		if len(v) > maxField {
			return worker{}, fmt.Errorf("hello %s of %d bytes, over %d", k, len(v), maxField)
		}
	}
	var err error
	num := func(key string, def int) int {
		v, ok := j[key]
		if !ok || err != nil {
			return def
		}
		n, perr := strconv.Atoi(v)
		if perr != nil {
			err = fmt.Errorf("hello %s %q: not a number", key, v)
		}
		return n
	}
	w.world = num(wire.HelloWorldSize, 0)
	w.localWorld = num(wire.HelloLocalWorldSize, 0)
	w.groupRank = num(wire.HelloGroupRank, -1)
	switch {
	case err != nil:
		return worker{}, err
	case w.world < 1 || w.world > maxWorld:
		return worker{}, fmt.Errorf("hello world_size %d: want 1 to %d", w.world, maxWorld)
	case w.localWorld < 1 || w.localWorld > w.world || w.localWorld > maxLocalWorld:
		return worker{}, fmt.Errorf("hello local_world_size %d: want 1 to world_size %d, at most %d", w.localWorld, w.world, maxLocalWorld)
	case w.rank < 0 || w.rank >= w.world:
		return worker{}, fmt.Errorf("hello rank %d outside [0, %d)", w.rank, w.world)
	case w.localRank < 0 || w.localRank >= w.localWorld || w.offset() < 0:
		return worker{}, fmt.Errorf("hello local rank %d: want 0 to %d, at most the rank %d", w.localRank, w.localWorld-1, w.rank)
	}
	if w.groupRank < 0 {
		w.groupRank = w.rank / w.localWorld
	}
	return w, nil
}
