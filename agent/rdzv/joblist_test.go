package rdzv

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestListJobs(t *testing.T) {
	dial := testStore(t)
	cli := dial()
	// t1 is a real job whose agent hosts the store.
	cfg := testConfig(t, 1, 1)
	cfg.JobID, cfg.Prefix, cfg.Hosted = "t1", Prefix(RootPrefix, "t1"), true
	nextAll(t, open(t, dial(), cfg))
	// Ids that sort around t1 in key order, which the skipping must not
	// confuse with it.
	for _, id := range []string{"t10", "t1-x", "t1.x"} {
		put(t, cli, Prefix(RootPrefix, id)+jobKey, JobInfo{ID: id})
		put(t, cli, Prefix(RootPrefix, id)+stateKey, State{Generation: 2, Phase: Joining})
	}
	put(t, cli, Prefix(RootPrefix, "t10")+nodesDir+"n1", NodeInfo{Node: "n1"})
	put(t, cli, Prefix(RootPrefix, "t10")+nodesDir+"n2", NodeInfo{Node: "n2"})
	put(t, cli, Prefix(RootPrefix, "broken")+stateKey, "{")
	put(t, cli, KVPrefix(Prefix(RootPrefix, "old"))+"k", "v") // no job
	put(t, cli, "/elsewhere/t9/job", encode(JobInfo{ID: "t9"}))

	l, err := ListJobs(t.Context(), cli, RootPrefix)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := l.IDs(), []string{"broken", "t1", "t1-x", "t1.x", "t10"}; !slices.Equal(got, want) {
		t.Fatalf("ids %q, want %q", got, want)
	}
	if l.Hosted != "t1" || !l.Has("t1") || l.Has("old") || l.Revision == 0 {
		t.Fatalf("list: %+v", l)
	}
	byID := map[string]JobSummary{}
	for _, j := range l.Jobs {
		byID[j.ID] = j
	}
	if j := byID["t1"]; j.Phase != Running || j.Nodes != 1 || j.Problem != "" {
		t.Fatalf("t1: %+v", j)
	}
	if j := byID["t10"]; j.Phase != Joining || j.Generation != 2 || j.Nodes != 2 {
		t.Fatalf("t10: %+v", j)
	}
	if j := byID["broken"]; j.Phase != "" || !strings.Contains(j.Problem, "no job key") || !strings.Contains(j.Problem, "malformed") {
		t.Fatalf("broken: %+v", j)
	}
	if s := readStatus(t, cli, RootPrefix, "t1"); !s.Hosted {
		t.Fatalf("t1 not hosted: %+v", s)
	}

	// another root holds other jobs
	l, err = ListJobs(t.Context(), cli, "/elsewhere/")
	if err != nil || !slices.Equal(l.IDs(), []string{"t9"}) {
		t.Fatalf("other root: %+v, %v", l, err)
	}
}

// TestListJobsManyJobs crosses the batch size of the summaries.
func TestListJobsManyJobs(t *testing.T) {
	cli := testStore(t)()
	var want []string
	for i := range listBatch + 5 {
		id := fmt.Sprintf("job%03d", i)
		want = append(want, id)
		put(t, cli, Prefix(RootPrefix, id)+stateKey, State{Generation: uint64(i), Phase: Running})
	}
	l, err := ListJobs(t.Context(), cli, RootPrefix)
	if err != nil || !slices.Equal(l.IDs(), want) {
		t.Fatalf("ListJobs: %v, %v", l.IDs(), err)
	}
	if j := l.Jobs[listBatch+2]; j.Generation != listBatch+2 || j.Phase != Running {
		t.Fatalf("job after the first batch: %+v", j)
	}
}
