package supervisor

import (
	"strconv"

	"github.com/ddp-agent/ddp-agent/internal/envname"
)

// World is what a new generation changes in a group that carries on into
// it without restarting (agent/keep.go): a node was lost, the survivors'
// workers keep their processes, and their ranks, the world's size and the
// generation move; the workers' store too, where the lost node served it
// (ServeStore).
type World struct {
	Generation   uint64
	RankOffset   int
	WorldSize    int
	NodeRank     int
	NNodes       int
	RestartCount int
	MasterAddr   string
	MasterPort   int
}

// Renumber moves the group into world w. Every worker, a spare that took
// a rank included, becomes rank RankOffset+its local rank, and its
// console lines say so; a spare started or given a rank from now on gets
// w's variables. The processes themselves learn their new ranks from the
// caller (the world file, ddp_agent.InProcess). It returns each worker's
// new rank by pid. Call it between Waits, from Wait's goroutine.
func (g *Group) Renumber(w World) map[int]int {
	g.spawnMu.Lock() // no spare starts from the old spec meanwhile (AddSpare)
	defer g.spawnMu.Unlock()
	g.mu.Lock()
	defer g.mu.Unlock()
	spec := *g.spec
	spec.Generation, spec.RankOffset, spec.WorldSize = w.Generation, w.RankOffset, w.WorldSize
	spec.NodeRank, spec.NNodes, spec.RestartCount = w.NodeRank, w.NNodes, w.RestartCount
	spec.MasterAddr, spec.MasterPort = w.MasterAddr, w.MasterPort
	g.spec = &spec
	// The workers carry on into a new world: whatever replacement was
	// pending, they re-formed since, and its dead worker's old rank means
	// nothing in the new numbering (Outcomes).
	g.pending = nil
	ranks := make(map[int]int, len(g.workers))
	for _, wk := range g.workers {
		wk.Rank = w.RankOffset + wk.LocalRank
		ranks[wk.pid] = wk.Rank
		var streams Streams
		if spec.Streams != nil {
			streams = spec.Streams(wk.LocalRank)
		}
		prefix := []byte(RenderPrefix(streams.Prefix, spec.Role, wk.Worker))
		wk.stdout.setPrefix(prefix)
		wk.stderr.setPrefix(prefix)
	}
	return ranks
}

// worldEnv is the variables of a spec's world: every worker's, and what a
// spare given a rank must have over those it started with, the group
// having been renumbered since (Renumber).
func worldEnv(s *Spec) map[string]string {
	return map[string]string{
		"MASTER_ADDR":                s.MasterAddr,
		"MASTER_PORT":                strconv.Itoa(s.MasterPort),
		"WORLD_SIZE":                 strconv.Itoa(s.WorldSize),
		"ROLE_WORLD_SIZE":            strconv.Itoa(s.WorldSize),
		"GROUP_RANK":                 strconv.Itoa(s.NodeRank),
		"GROUP_WORLD_SIZE":           strconv.Itoa(s.NNodes),
		"TORCHELASTIC_RESTART_COUNT": strconv.Itoa(s.RestartCount),
		envname.Generation:           strconv.FormatUint(s.Generation, 10),
	}
}
