package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/rdzv"
	"github.com/ddp-agent/ddp-agent/agent/rdzv/store"
	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

// startStore starts an embedded etcd for one test and returns its endpoint
// and a client of it.
func startStore(t *testing.T) (string, *store.Client) {
	t.Helper()
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	srv, err := store.Start(t.Context(), store.ServerConfig{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv.Endpoint(), dialStore(t, srv.Endpoint())
}

func dialStore(t *testing.T, endpoint string) *store.Client {
	t.Helper()
	cli, err := store.Dial(t.Context(), store.ClientConfig{Endpoints: []string{endpoint}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func agentConfig(id string, min, max int) rdzv.Config {
	return rdzv.Config{
		JobID: id, Prefix: rdzv.Prefix(rdzv.RootPrefix, id), Endpoint: "test",
		Host: "h", Addr: "127.0.0.1", NProc: 2,
		NNodesMin: min, NNodesMax: max, MaxRestarts: 3,
		JoinTimeout: 20 * time.Second, LastCall: 300 * time.Millisecond, TTL: 2 * time.Second,
	}
}

// openAgent registers an agent of a job, each with its own client as
// separate processes would have.
func openAgent(t *testing.T, endpoint string, cfg rdzv.Config) *rdzv.Membership {
	t.Helper()
	e, err := rdzv.Open(t.Context(), dialStore(t, endpoint), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

// formRound has the agents form a round and returns each one's round.
func formRound(t *testing.T, es ...*rdzv.Membership) []*rdzv.Round {
	t.Helper()
	rounds := make([]*rdzv.Round, len(es))
	errs := make([]error, len(es))
	var wg sync.WaitGroup
	for i, e := range es {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			rounds[i], errs[i] = e.Next(ctx)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("agent %d: %v", i, err)
		}
	}
	return rounds
}

// standBy runs Next on e until the test ends, as a spare or a joiner does.
func standBy(t *testing.T, e *rdzv.Membership) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = e.Next(ctx)
	}()
	t.Cleanup(func() { cancel(); <-done }) // before e.Close: cleanups run last-in first-out
}

func runCLI(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// table returns the whitespace-separated fields of each line of the node
// table (after the blank line that ends the header).
func table(t *testing.T, out string) [][]string {
	t.Helper()
	_, tab, ok := strings.Cut(out, "\n\n")
	if !ok {
		t.Fatalf("no table in:\n%s", out)
	}
	tab, _, _ = strings.Cut(tab, "\n\n") // the nodes' table only
	var rows [][]string
	for _, line := range strings.Split(strings.TrimRight(tab, "\n"), "\n") {
		rows = append(rows, strings.Fields(line))
	}
	return rows
}

func TestStatusShowsARunningJob(t *testing.T) {
	ep, _ := startStore(t)
	cfg := agentConfig("t1", 2, 2)
	a, b := openAgent(t, ep, cfg), openAgent(t, ep, cfg)
	rounds := formRound(t, a, b)
	spare := openAgent(t, ep, cfg)
	standBy(t, spare)
	byRank := map[int]*rdzv.Membership{rounds[0].GroupRank: a, rounds[1].GroupRank: b}

	// torchrun's spellings, and no --rdzv-id: the store's only job
	for _, args := range [][]string{
		{"status", "--rdzv-endpoint", ep, "--rdzv-id", "t1"},
		{"status", "--rdzv_endpoint=" + ep, "--rdzv_id=t1", "--rdzv_backend", "c10d"},
		{"status", "--rdzv-endpoint", ep},
	} {
		code, out, errOut := runCLI(args...)
		if code != 0 || errOut != "" {
			t.Fatalf("%q: exit %d, stderr %q", args, code, errOut)
		}
		t.Logf("%q:\n%s", args, out)
		lines := strings.Split(out, "\n")
		head := regexp.MustCompile(`^job t1 \(store ` + regexp.QuoteMeta(ep) + `\)   generation 0   run [0-9a-f]{16}   running since \d\d:\d\d:\d\d \(\d+s\)$`)
		if !head.MatchString(lines[0]) {
			t.Fatalf("first line %q", lines[0])
		}
		second := regexp.MustCompile(`^nodes 2 \(min 2, max 2\)   world size 4   master 127\.0\.0\.1:\d+   restarts 0 of 3$`)
		if !second.MatchString(lines[1]) {
			t.Fatalf("second line %q", lines[1])
		}
		pid := fmt.Sprint(os.Getpid())
		want := [][]string{
			{"GROUP", "RANK", "NODE", "HOST", "ADDR", "RANKS", "PID", "STATE"},
			{"0", byRank[0].Node(), "h", "127.0.0.1", "0-1", pid, "running"},
			{"1", byRank[1].Node(), "h", "127.0.0.1", "2-3", pid, "running"},
			{"-", spare.Node(), "h", "127.0.0.1", "-", pid, "spare"},
		}
		if got := table(t, out); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("table\n%v\nwant\n%v", got, want)
		}
		store := regexp.MustCompile(`\nSTORE\nMEMBER +ENDPOINTS +ROLE +HEALTH +DB\n\S+ +` + regexp.QuoteMeta(ep) + ` +leader +healthy +[0-9.]+ [KM]iB\n`)
		if !store.MatchString(out) {
			t.Fatalf("no STORE section with its one member, the leader, at %s", ep)
		}
	}
}

func TestStatusJSON(t *testing.T) {
	ep, _ := startStore(t)
	cfg := agentConfig("t1", 1, 1)
	cfg.Hosted = true
	a := openAgent(t, ep, cfg)
	formRound(t, a)
	stalls := telemetry.Report{
		Stalls:     []string{"step 812 bucket 3: rank 1 (h, GPU 1, pid 4411) arrived 2.31 s after the others; 1 rank waited 2.3 GPU-seconds"},
		Stragglers: []telemetry.ReportedStraggler{{Rank: 1, Host: "h", GPU: "GPU-5c1e", Last: 15, Steps: 20}},
	}
	report, err := stalls.Encode(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := a.PublishStalls(t.Context(), report); err != nil {
		t.Fatal(err)
	}

	code, out, errOut := runCLI("status", "--rdzv-endpoint", ep, "--json")
	if code != 0 || errOut != "" || strings.Count(out, "\n") != 1 {
		t.Fatalf("exit %d, stderr %q, stdout %q", code, errOut, out)
	}
	// The field names are an interface: check them by name.
	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"store", "id", "revision", "hosted", "job", "state", "nodes"} {
		if _, ok := raw[k]; !ok {
			t.Fatalf("no %q in %s", k, out)
		}
	}
	var got struct {
		Store []string `json:"store"`
		rdzv.Status
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Store) != 1 || got.Store[0] != ep || got.ID != "t1" || !got.Hosted || got.Revision == 0 {
		t.Fatalf("parsed: %+v", got)
	}
	if got.State == nil || got.State.Phase != rdzv.Running || got.Job == nil || got.Job.NNodesMax != 1 {
		t.Fatalf("state %+v, job %+v", got.State, got.Job)
	}
	if len(got.Nodes) != 1 || got.Nodes[0].Node != a.Node() || got.Nodes[0].Role != rdzv.RoleRunning ||
		got.Nodes[0].Member == nil || got.Nodes[0].Entry == nil || got.Nodes[0].Entry.PID != os.Getpid() {
		t.Fatalf("nodes: %+v", got.Nodes)
	}
	var node struct {
		Stalls map[string]json.RawMessage `json:"stalls"`
	}
	var nodes struct {
		Nodes []json.RawMessage `json:"nodes"`
	}
	if err := json.Unmarshal([]byte(out), &nodes); err != nil || json.Unmarshal(nodes.Nodes[0], &node) != nil {
		t.Fatalf("nodes: %v: %s", err, out)
	}
	for _, k := range []string{"updated", "stalls", "stragglers"} {
		if _, ok := node.Stalls[k]; !ok {
			t.Fatalf("no %q in the node's stalls: %s", k, nodes.Nodes[0])
		}
	}
	if s := decodeReport(t, got.Nodes[0].Stalls); s == nil || s.Updated.IsZero() || fmt.Sprint(s.Stalls, s.Stragglers) != fmt.Sprint(stalls.Stalls, stalls.Stragglers) || s.Hang != "" {
		t.Fatalf("stalls %+v, want %+v", s, stalls)
	}

	code, out, errOut = runCLI("status", "--rdzv-endpoint", ep)
	t.Logf("\n%s", out)
	_, section, ok := strings.Cut(out, "\n\nSTALLS\n")
	want := regexp.MustCompile(`^` + regexp.QuoteMeta(a.Node()) + `  updated \d\d:\d\d:\d\d \(\d+s\)
  persistent straggler: rank 1 on h \(GPU GPU-5c1e\), held the others back in 15 of 20 steps
  stall: step 812 bucket 3: rank 1 \(h, GPU 1, pid 4411\) arrived 2\.31 s after the others; 1 rank waited 2\.3 GPU-seconds
$`)
	if code != 0 || errOut != "" || !ok || !want.MatchString(section) {
		t.Fatalf("exit %d, stderr %q, stalls section %q", code, errOut, section)
	}
}

// encodeReport is r as an agent stores it.
func encodeReport(t *testing.T, r telemetry.Report) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// decodeReport is the report status read, nil when none.
func decodeReport(t *testing.T, raw json.RawMessage) *telemetry.Report {
	t.Helper()
	if raw == nil {
		return nil
	}
	r, err := telemetry.DecodeReport(raw)
	if err != nil {
		t.Fatal(err)
	}
	return &r
}

func TestStatusSeveralJobs(t *testing.T) {
	ep, cli := startStore(t)
	openAgent(t, ep, agentConfig("t2", 2, 2))
	openAgent(t, ep, agentConfig("t1", 2, 2))

	code, out, errOut := runCLI("status", "--rdzv-endpoint", ep)
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	t.Logf("\n%s", out)
	if !strings.HasPrefix(out, "2 jobs in the store at "+ep+"; give --rdzv-id to show one\n") {
		t.Fatalf("list:\n%s", out)
	}
	want := [][]string{{"ID", "GENERATION", "PHASE", "NODES", "NOTE"}, {"t1", "0", "joining", "1", "-"}, {"t2", "0", "joining", "1", "-"}}
	if got := table(t, out); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("table %v, want %v", got, want)
	}

	code, out, _ = runCLI("status", "--rdzv-endpoint", ep, "--json")
	var list struct {
		Store []string `json:"store"`
		rdzv.JobList
	}
	if err := json.Unmarshal([]byte(out), &list); code != 0 || err != nil || fmt.Sprint(list.IDs()) != "[t1 t2]" || list.Store[0] != ep {
		t.Fatalf("exit %d, %v: %s", code, err, out)
	}

	// --rdzv-id picks one.
	if code, out, _ := runCLI("status", "--rdzv-endpoint", ep, "--rdzv-id", "t2"); code != 0 || !strings.HasPrefix(out, "job t2 ") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	// A store started for a job shows that one.
	if err := store.NewKV(cli, "").Set(t.Context(), rdzv.HostKey, []byte("t2")); err != nil {
		t.Fatal(err)
	}
	if code, out, _ := runCLI("status", "--rdzv-endpoint", ep); code != 0 || !strings.HasPrefix(out, "job t2 (store "+ep+", hosted for it)") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
}

func TestStatusNoSuchJob(t *testing.T) {
	ep, _ := startStore(t)
	code, out, errOut := runCLI("status", "--rdzv-endpoint", ep)
	if code != 1 || out != "" || errOut != fmt.Sprintf("ddp-agent status: no jobs in the store at %s (under /ddp-agent/v1/)\n", ep) {
		t.Fatalf("empty store: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, _, errOut = runCLI("status", "--rdzv-endpoint", ep, "--rdzv-id", "x")
	if code != 1 || errOut != fmt.Sprintf("ddp-agent status: no job \"x\" in the store at %s (no jobs there)\n", ep) {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	openAgent(t, ep, agentConfig("t1", 2, 2))
	openAgent(t, ep, agentConfig("t2", 2, 2))
	code, out, errOut = runCLI("status", "--rdzv-endpoint", ep, "--rdzv-id", "x", "--json")
	if code != 1 || out != "" || errOut != fmt.Sprintf("ddp-agent status: no job \"x\" in the store at %s (jobs there: t1, t2)\n", ep) {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

func TestStatusEtcdPrefix(t *testing.T) {
	ep, _ := startStore(t)
	cfg := agentConfig("t1", 2, 2)
	cfg.Prefix = rdzv.Prefix("/team-a/", "t1")
	openAgent(t, ep, cfg)
	if code, out, errOut := runCLI("status", "--rdzv-endpoint", ep, "--rdzv-conf", "etcd_prefix=/team-a"); code != 0 || !strings.HasPrefix(out, "job t1 ") {
		t.Fatalf("exit %d, stderr %q:\n%s", code, errOut, out)
	}
	if code, _, errOut := runCLI("status", "--rdzv-endpoint", ep); code != 1 || !strings.Contains(errOut, "no jobs in the store") {
		t.Fatalf("default prefix: exit %d, stderr %q", code, errOut)
	}
}

func TestStatusUnreachableStore(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now

	// A refused connection is the answer: no waiting out --timeout.
	begin := time.Now()
	code, out, errOut := runCLI("status", "--rdzv-endpoint", addr, "--timeout", "60s")
	took := time.Since(begin)
	t.Logf("took %v: %s", took, errOut)
	if code != 1 || out != "" || strings.Count(errOut, "\n") != 2 ||
		!strings.HasPrefix(errOut, "ddp-agent status: nothing listens at "+addr+" (connection refused): is the job running") ||
		!strings.Contains(errOut, "if that host died, give another node's address") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if took > 30*time.Second {
		t.Fatalf("a refused connection took %v", took)
	}

	// Something that accepts and never answers is waited for, up to --timeout.
	mute, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer mute.Close()
	go func() {
		for {
			c, err := mute.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	begin = time.Now()
	code, out, errOut = runCLI("status", "--rdzv-endpoint", mute.Addr().String(), "--timeout", "1s")
	took = time.Since(begin)
	t.Logf("took %v: %s", took, errOut)
	if code != 1 || out != "" || !strings.Contains(errOut, "torch's TCPStore, ddp-agent status cannot read it") ||
		!strings.HasPrefix(errOut, "ddp-agent status: rendezvous store at "+mute.Addr().String()+" accepted the connection but gave no answer within 1s") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if took > 3*time.Second {
		t.Fatalf("--timeout 1s took %v", took)
	}

	// A job's store under another token: the agents' hint, not a bare x509 error.
	job, err := store.OpenJobTLS(rdzv.StretchToken("the-jobs-own-token-0123"))
	if err != nil {
		t.Fatal(err)
	}
	defer job.Close()
	srv, err := store.Start(t.Context(), store.ServerConfig{TLS: job.Files, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	for _, args := range [][]string{{"--rdzv-token", "a-guessed-wrong-token-4567"}, nil} {
		code, _, errOut = runCLI(append([]string{"status", "--rdzv-endpoint", srv.Endpoint(), "--timeout", "5s"}, args...)...)
		if code != 1 || !strings.Contains(errOut, "is --rdzv-token, or DDP_AGENT_RDZV_TOKEN, the job's") {
			t.Errorf("status %v at a store of another token: exit %d, stderr %q", args, code, errOut)
		}
	}

	// TLS files are read before anything is sent
	code, _, errOut = runCLI("status", "--rdzv-endpoint", addr, "--rdzv-conf", "cacert=/nonexistent/ca.pem")
	if code != 1 || !strings.Contains(errOut, "/nonexistent/ca.pem") {
		t.Fatalf("bad CA: exit %d, stderr %q", code, errOut)
	}
}

func TestStatusMalformedValues(t *testing.T) {
	ep, cli := startStore(t)
	p := rdzv.Prefix(rdzv.RootPrefix, "t1")
	for k, v := range map[string]string{
		p + "job":       `{"id": "t1", "nnodes_min": 1, "nnodes_max": 2}`,
		p + "state":     `{"generation": "many"}`,
		p + "nodes/n1":  "{not json",
		p + "nodes/n2":  `{"node": "n2", "host": "h2", "addr": "10.0.0.2", "pid": 7, "state": "active"}`,
		rdzv.HostKey:    "t1",
		p + "kv/ignore": "\x00",
	} {
		if err := store.NewKV(cli, "").Set(t.Context(), k, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	code, out, errOut := runCLI("status", "--rdzv-endpoint", ep)
	t.Logf("\n%s", out)
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	for _, want := range []string{
		"job t1 (store " + ep + ", hosted for it)   no readable state\n",
		"nodes min 1, max 2\n",
		"NOTE: malformed value at " + p + "state: ",
		"NOTE: malformed value at " + p + "nodes/n1: ",
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("no %q in:\n%s", want, out)
		}
	}
	want := [][]string{
		{"GROUP", "RANK", "NODE", "HOST", "ADDR", "RANKS", "PID", "STATE"},
		{"-", "n1", "-", "-", "-", "-", "malformed"},
		{"-", "n2", "h2", "10.0.0.2", "-", "7", "active"},
	}
	if got := table(t, out); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("table %v, want %v", got, want)
	}

	code, out, _ = runCLI("status", "--rdzv-endpoint", ep, "--json")
	var got rdzv.Status
	if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil || got.State != nil || len(got.Malformed) != 2 {
		t.Fatalf("exit %d, %v: %s", code, err, out)
	}
}

// TestRenderStatus pins the table's layout on a job that lost a node
// while the state still says running, and on an open round.
func TestRenderStatus(t *testing.T) {
	now := time.Date(2025, 3, 14, 10, 17, 13, 0, time.UTC)
	member := func(node, host, addr string, rank int) *rdzv.Member {
		return &rdzv.Member{Node: node, Host: host, Addr: addr, GroupRank: rank, NProc: 2, RankOffset: 2 * rank}
	}
	entry := func(node, host, addr string, pid int, st rdzv.NodeState, reason string) *rdzv.NodeInfo {
		return &rdzv.NodeInfo{Node: node, Host: host, Addr: addr, PID: pid, NProc: 2, State: st, Reason: reason}
	}
	members := []rdzv.Member{*member("vm-1450-2b43cd", "vm", "10.0.0.1", 0), *member("vm2-77-00aa11", "vm2", "10.0.0.2", 1), *member("vm3-12-ffee01", "vm3", "10.0.0.3", 2)}
	st := &rdzv.Status{
		ID: "t1", Revision: 42,
		Job: &rdzv.JobInfo{ID: "t1", NNodesMin: 2, NNodesMax: 3, MaxRestarts: 3},
		State: &rdzv.State{Generation: 3, Run: "5f0c2a9e41b7d386", Phase: rdzv.Running, Since: now.Add(-2*time.Minute - 10*time.Second),
			Reason:   "node vm-123-ab (h2, group rank 1) lost: its agent is gone or cut off (lease ended)",
			Failures: 1, MaxRestarts: 3, Members: members, WorldSize: 6, MasterAddr: "10.0.0.1", MasterPort: 40533},
		Nodes: []rdzv.NodeStatus{
			{Node: "vm-1450-2b43cd", Role: rdzv.RoleRunning, Member: &members[0], Entry: entry("vm-1450-2b43cd", "vm", "10.0.0.1", 1450, rdzv.NodeActive, "")},
			{Node: "vm2-77-00aa11", Role: rdzv.RoleLost, Member: &members[1]},
			{Node: "vm3-12-ffee01", Role: rdzv.RoleRunning, Member: &members[2], Entry: entry("vm3-12-ffee01", "vm3", "10.0.0.3", 12, rdzv.NodeActive, "")},
			{Node: "vm4-99-aaaaaa", Role: rdzv.RoleLeft, Entry: entry("vm4-99-aaaaaa", "vm4", "10.0.0.4", 99, rdzv.NodeLeft, "stopped by SIGTERM")},
		},
	}
	st.Nodes[0].Entry.GPUs = &rdzv.NodeGPUs{Summary: "2× NVIDIA A40, PCIe only, up to PIX, driver 535.183.01, CUDA 12.2", Binding: "node", Ring: []int{1, 0}}
	st.Nodes[2].Entry.GPUs = &rdzv.NodeGPUs{Summary: "2× NVIDIA H100 80GB HBM3, NVLink between all pairs (NV18 or more)", Binding: "exclusive", Ring: []int{0, 1}}
	st.Nodes[0].Stalls = encodeReport(t, telemetry.Report{Updated: now.Add(-time.Minute), Stalls: []string{}, Stragglers: []telemetry.ReportedStraggler{}}) // nothing to show
	st.Nodes[2].Stalls = encodeReport(t, telemetry.Report{
		Updated: now.Add(-12 * time.Second),
		Stalls: []string{
			"step 808 bucket 3: rank 5 (vm3, GPU 1, pid 4411) arrived 2.12 s after the others; 1 rank waited 2.1 GPU-seconds",
			"step 809 bucket 3: rank 5 (vm3, GPU 1, pid 4411) arrived 2.20 s after the others; 1 rank waited 2.2 GPU-seconds",
			"step 810 bucket 3: rank 5 (vm3, GPU 1, pid 4411) arrived 2.25 s after the others; 1 rank waited 2.3 GPU-seconds",
			"step 811 bucket 3: rank 5 (vm3, GPU 1, pid 4411) arrived 2.28 s after the others; 1 rank waited 2.3 GPU-seconds",
			"step 812 bucket 3: rank 5 (vm3, GPU 1, pid 4411) arrived 2.31 s after the others; 1 rank waited 2.3 GPU-seconds",
		},
		Stragglers: []telemetry.ReportedStraggler{{Rank: 5, Host: "vm3", GPU: "GPU-5c1e6b2a-9f1d-4c3e-8a2b-0d7e6f5a4b3c", Last: 15, Steps: 20, LateMS: 212, Share: 0.104,
			Cause: "gpu", Evidence: "forward and backward take 210ms longer and its GPU is slowed: throttled: hw thermal slowdown"}, {Rank: 4, Last: 6, Steps: 20}},
		Hang:     "step 813 bucket 0 (generation 3) has not finished 30.00 s after the first rank arrived; waiting: rank 4; never arrived: rank 5 (vm3, GPU 1, pid 4411). Aborting the communicators.",
		Reformed: "re-formation 1 of generation 3: step 807 failed (RuntimeError: CUDA error); every rank resumed at step 807 with rank 0's state, 412.0 ms after the fault (abort 1.0 ms, rendezvous 200.0 ms, process_group 60.0 ms, state 51.0 ms, first_step 100.0 ms)",
	})
	var b strings.Builder
	renderStatus(&b, st, "127.0.0.1:29400", now)
	want := `job t1 (store 127.0.0.1:29400)   generation 3   run 5f0c2a9e41b7d386   running since 10:15:03 (2m10s)
nodes 3 (min 2, max 3)   world size 6   master 10.0.0.1:40533   restarts 1 of 3
last change: node vm-123-ab (h2, group rank 1) lost: its agent is gone or cut off (lease ended)

GROUP RANK  NODE            HOST  ADDR      RANKS  PID   STATE
0           vm-1450-2b43cd  vm    10.0.0.1  0-1    1450  running
1           vm2-77-00aa11   vm2   10.0.0.2  2-3    -     lost
2           vm3-12-ffee01   vm3   10.0.0.3  4-5    12    running
-           vm4-99-aaaaaa   vm4   10.0.0.4  -      99    left: stopped by SIGTERM

GPUS
vm-1450-2b43cd  2× NVIDIA A40, PCIe only, up to PIX, driver 535.183.01, CUDA 12.2  CUDA order 1,0  NUMA binding node
vm3-12-ffee01   2× NVIDIA H100 80GB HBM3, NVLink between all pairs (NV18 or more)  CUDA order 0,1  NUMA binding exclusive

STALLS
vm3-12-ffee01  updated 10:17:01 (12s)
  persistent straggler: rank 5 on vm3 (GPU GPU-5c1e6b2a-9f1d-4c3e-8a2b-0d7e6f5a4b3c), held the others back in 15 of 20 steps by 212 ms, 10.4% of step time; cause gpu: forward and backward take 210ms longer and its GPU is slowed: throttled: hw thermal slowdown
  persistent straggler: rank 4, held the others back in 6 of 20 steps
  (2 earlier stalls in --json)
  stall: step 810 bucket 3: rank 5 (vm3, GPU 1, pid 4411) arrived 2.25 s after the others; 1 rank waited 2.3 GPU-seconds
  stall: step 811 bucket 3: rank 5 (vm3, GPU 1, pid 4411) arrived 2.28 s after the others; 1 rank waited 2.3 GPU-seconds
  stall: step 812 bucket 3: rank 5 (vm3, GPU 1, pid 4411) arrived 2.31 s after the others; 1 rank waited 2.3 GPU-seconds
  hang: step 813 bucket 0 (generation 3) has not finished 30.00 s after the first rank arrived; waiting: rank 4; never arrived: rank 5 (vm3, GPU 1, pid 4411). Aborting the communicators.
  re-formed in process: re-formation 1 of generation 3: step 807 failed (RuntimeError: CUDA error); every rank resumed at step 807 with rank 0's state, 412.0 ms after the fault (abort 1.0 ms, rendezvous 200.0 ms, process_group 60.0 ms, state 51.0 ms, first_step 100.0 ms)
`
	if b.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", b.String(), want)
	}

	st.State = &rdzv.State{Generation: 4, Phase: rdzv.Joining, Since: now.Add(-26 * time.Hour), Reason: "node vm2-77-00aa11 (vm2, group rank 1) lost",
		Failures: 2, MaxRestarts: 3, Members: members[:2]}
	st.Nodes = []rdzv.NodeStatus{
		{Node: "vm-1450-2b43cd", Role: rdzv.RoleJoined, Member: &st.State.Members[0], Entry: entry("vm-1450-2b43cd", "vm", "10.0.0.1", 1450, rdzv.NodeActive, ""), Join: &rdzv.JoinInfo{Node: "vm-1450-2b43cd", NProc: 2}},
		{Node: "vm2-77-00aa11", Role: rdzv.RoleLost, Member: &st.State.Members[1]},
		{Node: "vm5-5-bbbbbb", Role: rdzv.RoleJoined, Entry: entry("vm5-5-bbbbbb", "vm5", "10.0.0.5", 5, rdzv.NodeActive, ""), Join: &rdzv.JoinInfo{Node: "vm5-5-bbbbbb", NProc: 4}},
		{Node: "vm6-6-cccccc", Role: rdzv.RoleJoining, Entry: entry("vm6-6-cccccc", "vm6", "10.0.0.6", 6, rdzv.NodeActive, "")},
	}
	st.Malformed = []rdzv.MalformedValue{{Key: "/ddp-agent/v1/t1/nodes/x", Error: "malformed value at /ddp-agent/v1/t1/nodes/x: unexpected end of JSON input"}}
	b.Reset()
	renderStatus(&b, st, "127.0.0.1:29400", now)
	want = `job t1 (store 127.0.0.1:29400)   generation 4   joining since 2025-03-13 08:17:13 (26h0m0s)
joined 2 (min 2, max 3)   not yet joined 1   restarts 2 of 3
last change: node vm2-77-00aa11 (vm2, group rank 1) lost
NOTE: malformed value at /ddp-agent/v1/t1/nodes/x: unexpected end of JSON input

LAST RANK  NODE            HOST  ADDR      NPROC  PID   STATE
0          vm-1450-2b43cd  vm    10.0.0.1  2      1450  joined, leads the round
1          vm2-77-00aa11   vm2   10.0.0.2  2      -     lost
-          vm5-5-bbbbbb    vm5   10.0.0.5  4      5     joined
-          vm6-6-cccccc    vm6   10.0.0.6  2      6     joining
`
	if b.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", b.String(), want)
	}
}

func TestStatusUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--rdzv-endpoint is required"},
		{[]string{"--rdzv-endpoint"}, "flag --rdzv-endpoint needs a value"},
		{[]string{"--rdzv-endpoint", ","}, "--rdzv-endpoint is required"},
		{[]string{"--rdzv-endpoint", "h:1", "--nnodes", "2"}, "unknown flag --nnodes"},
		{[]string{"--rdzv-endpoint", "h:1", "t1"}, `unexpected argument "t1"`},
		{[]string{"--rdzv-endpoint", "h:1", "--timeout", "0"}, "--timeout: \"0\" is not a positive duration"},
		{[]string{"--rdzv-endpoint", "h:1", "--timeout=soon"}, "--timeout: \"soon\" is not a positive duration"},
		{[]string{"--rdzv-endpoint", "h:1", "--json=1"}, "--json takes no value"},
		{[]string{"--rdzv-endpoint", "h:1", "--rdzv-backend", "static"}, "static has no store"},
		{[]string{"--rdzv-endpoint", "h:1", "--rdzv-backend", "zk"}, `--rdzv-backend "zk" is not c10d or etcd`},
		{[]string{"--rdzv-endpoint", "h:1", "--rdzv-id", "a/b"}, `rendezvous id "a/b"`},
		{[]string{"--rdzv-endpoint", "h:1", "--rdzv-conf", "bogus=1"}, `unknown key "bogus"`},
		{[]string{"--rdzv-endpoint", "h:1", "--rdzv-conf", "cert=c.pem"}, "cert and key go together"},
	} {
		code, out, errOut := runCLI(append([]string{"status"}, tc.args...)...)
		if code != 2 || out != "" || !strings.HasPrefix(errOut, "ddp-agent status: ") || !strings.Contains(errOut, tc.want) || !strings.HasSuffix(errOut, "(see ddp-agent help status)\n") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want %q", tc.args, code, out, errOut, tc.want)
		}
	}
	for _, args := range [][]string{{"status", "--help"}, {"status", "--rdzv-endpoint", "h:1", "-h"}, {"help", "status"}} {
		if code, out, _ := runCLI(args...); code != 0 || !strings.HasPrefix(out, "Usage: ddp-agent status") {
			t.Errorf("%q: exit %d:\n%s", args, code, out)
		}
	}
	if code, out, _ := runCLI("help"); code != 0 || !strings.Contains(out, "ddp-agent status") {
		t.Errorf("help: exit %d:\n%s", code, out)
	}
}

func TestStatusEndpointsDefaultPorts(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--rdzv-endpoint", "node1"}, "[node1:29400]"},
		{[]string{"--rdzv-endpoint", "node1:1234"}, "[node1:1234]"},
		{[]string{"--rdzv-backend", "etcd", "--rdzv-endpoint", "e1,e2:2000,https://e3:2379"}, "[e1:2379 e2:2000 https://e3:2379]"},
	} {
		f, err := parseStatusFlags(tc.args)
		if err != nil || fmt.Sprint(f.endpoints) != tc.want {
			t.Errorf("%q: %v, %v; want %s", tc.args, f, err, tc.want)
		}
	}
}
