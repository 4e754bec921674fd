package agent

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ddp-agent/ddp-agent/agent/rdzv"
)

func TestKeepsWorkers(t *testing.T) {
	lost := func(node string) rdzv.RoundEnd { return rdzv.RoundEnd{Kind: rdzv.EndNodeLost, Node: node} }
	tests := []struct {
		name       string
		spares     int
		agentStore bool
		end        rdzv.RoundEnd
		keep       bool
		why        string // "" where nothing is logged
	}{
		{"a node lost", 1, true, lost("c"), true, ""},
		{"a node left", 1, true, rdzv.RoundEnd{Kind: rdzv.EndNodeLeft, Node: "b"}, true, ""},
		{"no spares", 0, true, lost("c"), false, ""},
		{"a node joined", 1, true, rdzv.RoundEnd{Kind: rdzv.EndNodeJoined, Node: "d"}, true, ""},
		{"a worker's fault", 1, true, rdzv.RoundEnd{Kind: rdzv.EndRestart, Node: "b"}, false, ""},
		{"rank 0's store", 1, false, lost("c"), false, "rank 0's worker served the workers' store"},
		{"the store's node lost", 1, true, lost("a"), true, ""},
	}
	for _, tc := range tests {
		keep, why := keepsWorkers(tc.spares, tc.agentStore, tc.end)
		if keep != tc.keep || (tc.why == "") != (why == "") || !strings.Contains(why, tc.why) {
			t.Errorf("%s: got %v %q, want %v %q", tc.name, keep, why, tc.keep, tc.why)
		}
	}
}

func TestCarriesOn(t *testing.T) {
	old := rdzv.Round{NProc: 2, MasterNode: "a", MasterAddr: "10.0.0.1", MasterPort: 29500, AgentStore: true}
	tests := []struct {
		name string
		next func(r *rdzv.Round)
		why  string // "" when they carry on
	}{
		{"shrunk", func(r *rdzv.Round) { r.WorldSize, r.RankOffset = 4, 2 }, ""},
		{"not a round to carry on into", func(r *rdzv.Round) { r.Carry = false }, "does not carry the workers on"},
		{"another store node", func(r *rdzv.Round) { r.MasterNode = "b" }, ""},
		{"another store port", func(r *rdzv.Round) { r.MasterPort = 29501 }, ""},
		{"rank 0's store", func(r *rdzv.Round) { r.AgentStore = false }, "does not carry the workers on"},
		{"an older leader", func(r *rdzv.Round) { r.MasterNode = "" }, "does not say which node"},
		{"other nproc", func(r *rdzv.Round) { r.NProc = 4 }, "number of workers changed"},
		{"a node without --spares", func(r *rdzv.Round) { r.Carry, r.PlainNodes = false, "node c" },
			"node c runs without --spares: its workers cannot join"},
		{"nodes without --spares", func(r *rdzv.Round) { r.Carry, r.PlainNodes = false, "nodes c, d" },
			"nodes c, d run without --spares: their workers cannot join"},
	}
	for _, tc := range tests {
		next := rdzv.Round{NProc: old.NProc, MasterNode: old.MasterNode, MasterAddr: old.MasterAddr, MasterPort: old.MasterPort,
			AgentStore: old.AgentStore, Carry: true}
		tc.next(&next)
		ok, why := carriesOn(&old, &next)
		if ok != (tc.why == "") || !strings.Contains(why, tc.why) {
			t.Errorf("%s: got %v %q, want %q", tc.name, ok, why, tc.why)
		}
	}
}

func TestStoreMoves(t *testing.T) {
	old := &rdzv.Round{MasterNode: "a", MasterAddr: "10.0.0.1", MasterPort: 29500}
	for _, tc := range []struct {
		name string
		next *rdzv.Round
		want bool
	}{
		{"the same store", &rdzv.Round{MasterNode: "a", MasterAddr: "10.0.0.1", MasterPort: 29500}, false},
		{"another node", &rdzv.Round{MasterNode: "b", MasterAddr: "10.0.0.2", MasterPort: 29500}, true},
		{"another port", &rdzv.Round{MasterNode: "a", MasterAddr: "10.0.0.1", MasterPort: 29501}, true},
	} {
		if got := storeMoves(old, tc.next); got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestKeptStorePort(t *testing.T) {
	at := func(groupRank int, agentStore bool) *attempt {
		return &attempt{r: &rdzv.Round{GroupRank: groupRank, AgentStore: agentStore, MasterPort: 4242}}
	}
	for _, tc := range []struct {
		name string
		kept *attempt
		want int
	}{
		{"nothing kept", nil, 0}, {"the store's node", at(0, true), 4242}, {"another node", at(1, true), 0},
		{"rank 0's worker serves it", at(0, false), 0},
	} {
		if got := keptStorePort(tc.kept); got != tc.want {
			t.Errorf("%s: got %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestWriteWorld(t *testing.T) {
	path := filepath.Join(t.TempDir(), worldFileName)
	read := func() (world, string) {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var w world
		if err := json.Unmarshal(b, &w); err != nil {
			t.Fatalf("%v: %s", err, b)
		}
		return w, string(b)
	}
	if err := writeWorld(path, world{Generation: 2, Moving: true}); err != nil {
		t.Fatal(err)
	}
	if w, b := read(); w.Generation != 2 || !w.Moving || w.Ranks != nil {
		t.Fatalf("got %s", b)
	}
	rd := &rdzv.Round{Generation: 3, Restarts: 1, WorldSize: 4, GroupRank: 1, NNodes: 2}
	if err := writeWorld(path, newWorld(rd, map[int]int{101: 2, 102: 3})); err != nil {
		t.Fatal(err)
	}
	w, b := read()
	if w.Generation != 3 || w.Moving || w.RestartCount != 1 || w.WorldSize != 4 || w.GroupRank != 1 || w.NNodes != 2 ||
		w.Ranks["101"] != 2 || w.Ranks["102"] != 3 || len(w.Ranks) != 2 {
		t.Fatalf("got %s", b)
	}
	if _, err := os.Stat(path + ".tmp"); !os.IsNotExist(err) {
		t.Fatalf("the temporary file is left: %v", err)
	}
	if err := writeWorld(filepath.Join(t.TempDir(), "missing", worldFileName), w); err == nil {
		t.Fatal("want an error for a directory that does not exist")
	}
}
