package rdzv

import (
	"strings"
	"testing"
	"time"
)

func TestMalformedValuesDoNotStopTheJob(t *testing.T) {
	dial := testStore(t)
	cfg := testConfig(t, 2, 2)
	cli := dial()
	a, b := open(t, dial(), cfg), open(t, dial(), cfg)
	// garbage in a node entry and a join entry of the first round
	if _, err := cli.Etcd().Put(t.Context(), cfg.Prefix+nodesDir+"garbage", "{not json"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Etcd().Put(t.Context(), RoundPrefix(cfg.Prefix, 0)+"garbage", "\x00\x01"); err != nil {
		t.Fatal(err)
	}
	rounds := nextAll(t, a, b)
	checkRounds(t, rounds)
	// garbage in the state itself: the job moves to a fresh generation
	if _, err := cli.Etcd().Put(t.Context(), cfg.Prefix+stateKey, `{"generation": "many"}`); err != nil {
		t.Fatal(err)
	}
	for _, r := range rounds {
		waitDone(t, r, 2*time.Second)
	}
	next := nextAll(t, a, b)
	checkRounds(t, next)
	if next[0].Generation <= rounds[0].Generation {
		t.Fatalf("generation went from %d to %d", rounds[0].Generation, next[0].Generation)
	}
	// a malformed job entry refuses newcomers with a clear error, no panic
	if _, err := cli.Etcd().Put(t.Context(), cfg.Prefix+jobKey, "[]"); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(t.Context(), dial(), cfg); err == nil || !strings.Contains(err.Error(), "malformed value at "+cfg.Prefix+jobKey) {
		t.Fatalf("malformed job entry: %v", err)
	}
}
