package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/rdzv"
	"github.com/ddp-agent/ddp-agent/agent/supervisor"
	"github.com/ddp-agent/ddp-agent/shim/status"
	"github.com/ddp-agent/ddp-agent/wire"
)

// Under --spares, a change of the job's nodes (one lost, left or joined)
// no longer restarts the workers. Each agent of the last round keeps its
// worker group through the end of the round: it marks the world file
// "moving" and aborts the workers' communicators, so every worker enters
// ddp_agent.InProcess's re-formation and holds there. It joins the next
// round like any agent and, when that round allows it (carriesOn), moves
// its workers into it without stopping them: the group is renumbered, and
// the workers read their new ranks and the new world's size from the
// world file and re-form there, with the state they hold. Agents that
// start workers afresh in such a round (a new node's, one that could not
// keep its own) start them to join that re-formation (Spec.Join). Where
// the round does not allow it, the kept workers are stopped and started
// again, as without spares, and the log says why.

// worldFileName is the world file's name in the run's directory
// (DDP_AGENT_WORLD_FILE).
const worldFileName = "world.json"

// keepsWorkers is whether this node's workers outlive the round that
// ended with end, to carry on into the next one in process, and why not:
// pure. spares: the run keeps warm spares (--spares, which says its
// script re-forms in process); agentStore: the round's workers' store
// has a process of its own (on the node that left, too: the next round's
// group rank 0 serves a new one, and the workers move to it).
func keepsWorkers(spares int, agentStore bool, end rdzv.RoundEnd) (bool, string) {
	switch {
	case spares == 0:
		return false, ""
	case end.Kind != rdzv.EndNodeLost && end.Kind != rdzv.EndNodeLeft && end.Kind != rdzv.EndNodeJoined:
		return false, ""
	case !agentStore:
		return false, "rank 0's worker served the workers' store"
	}
	return true, ""
}

// carriesOn is whether the workers kept from round old carry on into
// round next, and why not: pure. The round must say so (Carry: the last
// one ran with an agent's store), and then every node that starts
// workers afresh in it starts them to join the others' re-formation
// (Spec.Join). Its store is the last round's, or, where the node that
// served that one left, a new one that its group rank 0 serves
// (storeMoves).
func carriesOn(old, next *rdzv.Round) (bool, string) {
	switch {
	case next.MasterNode == "":
		// A round closed by an agent from before MasterNode: which node
		// serves the store is unknown.
		return false, "the new generation does not say which node serves the workers' store"
	case next.PlainNodes != "":
		return false, plainWhy(next.PlainNodes)
	case !next.Carry || !next.AgentStore:
		return false, "the new generation does not carry the workers on (a worker's fault ended the last, or its store is not an agent's)"
	case next.NProc != old.NProc:
		return false, "this node's number of workers changed"
	}
	return true, ""
}

// plainWhy says why workers cannot carry on into a round whose nodes
// differ in --spares, from the round's PlainNodes ("node a", "nodes a, b").
func plainWhy(plain string) string {
	if strings.HasPrefix(plain, "nodes ") {
		return plain + " run without --spares: their workers cannot join the others' re-formation"
	}
	return plain + " runs without --spares: its workers cannot join the others' re-formation"
}

// warnPlain tells, once per set of nodes (seen: the last one told), that
// round rd's nodes differ in --spares, and returns the set told. A node
// without it (a launcher's flags that differ) would otherwise pass
// unnoticed until a change of the job's nodes restarts every worker.
func (r *run) warnPlain(rd *rdzv.Round, seen string) string {
	if rd.PlainNodes != "" && rd.PlainNodes != seen {
		r.log.Warn("the job's nodes differ in --spares: a change of its nodes restarts every worker, as without spares; give every node the same --spares",
			"without", rd.PlainNodes, "this_node", r.cfg.Spares, "generation", rd.Generation)
	}
	return rd.PlainNodes
}

// storeMoves is whether the workers carried from round old into round
// next change stores: the node that served old's left. Pure.
func storeMoves(old, next *rdzv.Round) bool {
	return next.MasterNode != old.MasterNode || next.MasterAddr != old.MasterAddr || next.MasterPort != old.MasterPort
}

// keptStorePort is the port of the workers' store that kept's workers
// use, when this node serves it (group rank 0, with the store's process):
// the next round must offer it, for them to carry on with that store
// rather than move to a new one. Else 0.
func keptStorePort(kept *attempt) int {
	if kept == nil || kept.r.GroupRank != 0 || !kept.r.AgentStore {
		return 0
	}
	return kept.r.MasterPort
}

// world is the world file's content: the generation the workers carry on
// into, and each one's rank in it by pid; or, Moving, that the workers of
// Generation are kept to move into the next one, not known yet, and their
// re-formation must not end in this one (after a node joined, no rank is
// missing from it).
type world struct {
	Generation   uint64         `json:"generation"`
	Moving       bool           `json:"moving,omitempty"`
	RestartCount int            `json:"restart_count"`
	WorldSize    int            `json:"world_size"`
	GroupRank    int            `json:"group_rank"`
	NNodes       int            `json:"nnodes"`
	Ranks        map[string]int `json:"ranks,omitempty"` // pid -> rank
	// The workers' store, MASTER_ADDR:MASTER_PORT: a worker whose store
	// is another one connects to this one.
	MasterAddr string `json:"master_addr,omitempty"`
	MasterPort int    `json:"master_port,omitempty"`
}

// carryOn moves the workers kept from attempt kept into round rd, as
// attempt n, and returns that attempt; or, where they cannot carry on,
// stops them and returns nil, for a new attempt to start them again.
func (r *run) carryOn(ctx context.Context, kept *attempt, rd *rdzv.Round, n int) *attempt {
	ok, why := carriesOn(kept.r, rd)
	if ok && kept.g.State() != supervisor.StateHealthy {
		ok, why = false, "a worker exited meanwhile"
	}
	at := &attempt{n: n, gen: rd.Generation, r: rd, g: kept.g, dir: kept.dir, started: time.Now()}
	if ok {
		if err := r.move(at, kept.r); err != nil {
			ok, why = false, err.Error()
		}
	}
	if !ok {
		r.log.Warn("warm spares: the workers cannot carry on into the new generation in process; restarting them",
			"why", why, "generation", rd.Generation)
		kept.g.Stop(syscall.SIGTERM, r.cfg.StopTimeout)
		return nil
	}
	r.mu.Lock()
	r.last = at
	r.mu.Unlock()
	r.srv.SetGeneration(at.gen, rd.WorldSize, nil) // the workers' new communicators bootstrap in it
	r.faults.Clear()
	r.setGroup(at.g, rd.RankOffset)
	r.observe(ctx, at)
	r.log.Info("workers carry on in process into the new generation", "attempt", n, "generation", at.gen,
		"group_rank", rd.GroupRank, "nnodes", rd.NNodes, "world_size", rd.WorldSize, "pids", at.g.PIDs(),
		"store", net.JoinHostPort(rd.MasterAddr, strconv.Itoa(rd.MasterPort)), "store_moved", storeMoves(kept.r, rd))
	return at
}

// move renumbers the group of attempt at, kept from round old, into its
// round, starts the workers' new store where this node serves it, and
// tells the workers through the world file.
func (r *run) move(at *attempt, old *rdzv.Round) error {
	rd := at.r
	ranks := at.g.Renumber(supervisor.World{Generation: rd.Generation, RankOffset: rd.RankOffset, WorldSize: rd.WorldSize,
		NodeRank: rd.GroupRank, NNodes: rd.NNodes, RestartCount: rd.Restarts, MasterAddr: rd.MasterAddr,
		MasterPort: rd.MasterPort})
	// The store before the world file: the workers connect to it once
	// they read the file (and retry until it listens).
	started, spareUsed, err := at.g.ServeStore()
	if err != nil {
		return err
	}
	if started {
		r.log.Warn("warm spares: the node that served the workers' store left; this node serves the new generation's",
			"generation", rd.Generation, "old", net.JoinHostPort(old.MasterAddr, strconv.Itoa(old.MasterPort)),
			"new", net.JoinHostPort(rd.MasterAddr, strconv.Itoa(rd.MasterPort)), "from_spare", spareUsed)
	}
	if spareUsed {
		r.refill(at, 0)
	}
	return writeWorld(r.worldFile(), newWorld(rd, ranks))
}

// worldFile is the path of the run's world file (DDP_AGENT_WORLD_FILE).
func (r *run) worldFile() string { return filepath.Join(r.runDir, worldFileName) }

// newWorld is the world of round rd, whose workers are ranks by pid.
func newWorld(rd *rdzv.Round, ranks map[int]int) world {
	w := world{Generation: rd.Generation, RestartCount: rd.Restarts, WorldSize: rd.WorldSize, GroupRank: rd.GroupRank,
		NNodes: rd.NNodes, Ranks: make(map[string]int, len(ranks)), MasterAddr: rd.MasterAddr, MasterPort: rd.MasterPort}
	for pid, rank := range ranks {
		w.Ranks[strconv.Itoa(pid)] = rank
	}
	return w
}

// writeWorld writes the world file in one rename: a worker polling it
// never reads half of it.
func writeWorld(path string, w world) error {
	b, err := json.Marshal(w)
	if err != nil {
		return fmt.Errorf("world file: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("world file: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("world file: %w", err)
	}
	return nil
}

// release stops the workers kept for a next round that does not come to
// them: the job ended, this node drains, the agent stops.
func (r *run) release(kept *attempt, why string) {
	if kept == nil {
		return
	}
	r.log.Info("stopping the workers kept for the next generation", "reason", why)
	kept.g.Stop(syscall.SIGTERM, r.cfg.StopTimeout)
}

// probeIfPeerLost probes the other nodes' agents when a worker's shim
// reports a collective that failed on a lost peer, under --spares. Without
// spares a lost node shows in a worker's exit on a lost connection, which
// has the agent probe its peers (workerFailure) and end the round at once.
// Here the workers do not exit: they wait in their re-formation, and
// without this probe the round would end only when the lost node's lease
// ran out (seconds; tens with torchrun's defaults). One probe at a time.
func (r *run) probeIfPeerLost(ev wire.Events) {
	if r.cfg.Spares == 0 || !slices.ContainsFunc(ev.Events, func(e wire.CollectiveEvent) bool { return e.Status == status.Peer }) {
		return
	}
	if !r.probing.TryLock() {
		return
	}
	r.goBackground(func() {
		defer r.probing.Unlock()
		ctx, cancel := context.WithTimeout(r.srvCtx, 5*time.Second)
		defer cancel()
		if r.j.rz.CheckPeers(ctx) == rdzv.PeerGone {
			r.log.Info("a collective failed on a lost peer, and another node's agent is gone: its lease is revoked")
		}
	})
}
