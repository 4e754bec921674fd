package rdzv

import "testing"

// TestStaticRun: one node names its run itself, once for all its rounds;
// the nodes of several have nothing to agree on one through, and leave
// trace ids to the job id alone.
func TestStaticRun(t *testing.T) {
	one := &Static{NNodes: 1, NProc: 2, MasterAddr: "127.0.0.1", MasterPort: 29500}
	a, err := one.Next(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	b, err := one.Next(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if a.Run == "" || b.Run != a.Run || b.Generation != a.Generation+1 {
		t.Fatalf("one node's rounds: run %q gen %d, then run %q gen %d", a.Run, a.Generation, b.Run, b.Generation)
	}
	other, err := (&Static{NNodes: 1, NProc: 2, MasterAddr: "127.0.0.1", MasterPort: 29500}).Next(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if other.Run == a.Run {
		t.Fatalf("two runs of one node named %q both", a.Run)
	}
	two, err := (&Static{NodeRank: 1, NNodes: 2, NProc: 2, MasterAddr: "127.0.0.1", MasterPort: 29500}).Next(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if two.Run != "" {
		t.Fatalf("a node of two named its run %q alone", two.Run)
	}
}
