// Command rdzvscale measures the etcd rendezvous (agent/rdzv) at scale: N
// simulated agents, each running the real client code (rdzv.Open, then
// Next) against one embedded etcd (store.Start on 127.0.0.1:0), as many
// agents as a job of N nodes has. It measures three things per run:
//
//   - open: N agents call Open at once (each checks the store, creates or
//     checks the job, grants a lease and registers); the time until the
//     last Open returns.
//   - round: every agent calls Next at the same moment; the time until the
//     last Next returns. NNodesMin = NNodesMax = N, so the round closes as
//     soon as all N joined (no last-call wait).
//   - re-form: -settle (1 s) after that round, one agent calls
//     Fail(round); every agent calls Next again once its Round's Done()
//     closes, as a real agent does (and again, should that round end too);
//     the time from the Fail call until every agent holds a running round
//     of one generation.
//
// It checks what it measures (one generation, N distinct group ranks, each
// agent listed in its round's members; after the fault, the next
// generation with every group rank kept and exactly one more restart; no
// round ended before the fault) and prints a Markdown table of the medians
// over -runs runs, against the goal of the issue: a round of 1024 agents in
// under 2 s. There is no torchrun baseline: torchrun's c10d rendezvous
// cannot be run with 1024 agents on one machine. A run that fails says
// where and why after the table; the table counts it in "runs ok".
//
//	go run ./examples/bench/rdzvscale
//	go run ./examples/bench/rdzvscale -n 1024 -clients 8,64,n -runs 3 -detail
//	go run ./examples/bench/rdzvscale -n 1024 -runs 1 -cpuprofile /tmp/rdzv.prof -lockprofile /tmp/rdzv
//	    # then: go tool pprof -top /tmp/rdzv.prof                      (agents and clients)
//	    #       go tool pprof -top /tmp/rdzv.prof.etcd.n1024.k64.r1    (the etcd server)
//	    #       go tool pprof -top /tmp/rdzv.etcd.n1024.k64.r1.mutex   (etcd's lock contention)
//
// The etcd server runs in a child process (this program, re-executed with
// -serve), so that its RSS and CPU are its own and not the simulated
// agents'; every run gets a fresh one. -detail adds, per phase, the
// agents' store requests (count, latency, when the first and the last
// completed, bytes read; watch events as they arrive) and the server's
// counters from its /metrics (gRPC messages and bytes sent, watch events,
// slow applies, lease renewals). -trace writes an execution trace of the
// agents' side of the last run.
//
// Clients. A real agent has its own etcd client: its own TCP connection,
// gRPC streams (one watch stream, one lease keep-alive stream) and
// goroutines. -clients K lets the N simulated agents share K clients
// (agent i uses client i mod K): K = N ("n") is the faithful setting, but
// on a small machine N clients cost the benchmark process itself CPU and
// memory that a real cluster spreads over N hosts, and that CPU is taken
// from the same cores the etcd server runs on. With K < N the server sees
// fewer connections and streams: the watches and keep-alives of the
// agents of one client share that client's streams (and clientv3 creates
// the watches of one stream one at a time), which is kinder to the server
// and harder on the clients than reality; the number of requests,
// watchers and leases is the same. Compare a small and a large K to see
// which side of that trade-off matters.
//
// CPU. Before each run a probe spins GOMAXPROCS threads for 300 ms and
// reports how many cores they got: on a shared or oversubscribed VM it is
// well below GOMAXPROCS, everything in that run is slower for it, and the
// table shows it next to the timings.
//
// Every scenario of a run is bounded by -timeout (60 s); a run that fails
// or times out is reported and counted, never hangs. The agents' logs are
// discarded unless -v, but their warnings and errors, the etcd server's and
// the clients' are counted and listed after the table (etcd "too many
// requests", message-size limits, lost leases, slow applies would show
// there).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ddp-agent/ddp-agent/agent/rdzv"
	"github.com/ddp-agent/ddp-agent/agent/rdzv/store"
)

// goal is the target for one round of 1024 agents.
const goal = 2 * time.Second

const jobID = "rdzvscale"

type options struct {
	ns       []int
	clients  []string // each a number or "n"
	runs     int
	ttl      time.Duration
	timeout  time.Duration
	nproc    int
	detail   bool
	verbose  bool
	cpuprof  string
	lockprof string
	trace    string
	settle   time.Duration
	selfPath string
}

func main() {
	n := flag.String("n", "16,256,1024", "comma-separated agent counts")
	clients := flag.String("clients", "64", "comma-separated: how many etcd clients the N agents share (each capped at N); \"n\" = one per agent, as in reality")
	runs := flag.Int("runs", 3, "runs per N and client count (medians are reported)")
	ttl := flag.Duration("ttl", 3*time.Second, "the agents' lease TTL (keep-alives go every TTL/3)")
	timeout := flag.Duration("timeout", 60*time.Second, "bound on each scenario (open, round, re-form) of a run")
	nproc := flag.Int("nproc", 8, "workers per simulated agent (only the size of the members list depends on it)")
	detail := flag.Bool("detail", false, "per phase: the agents' store requests and the etcd server's counters")
	verbose := flag.Bool("v", false, "the agents', clients' and etcd's logs to stderr")
	cpuprof := flag.String("cpuprofile", "", "write this process's CPU profile (agents and clients) here, and each run's etcd server's to FILE.etcd.nN.kK.rR")
	serve := flag.Bool("serve", false, "internal: be the etcd server of a parent rdzvscale")
	lockprof := flag.String("lockprofile", "", "write each run's etcd server's mutex and block profiles to FILE.etcd.nN.kK.rR.{mutex,block}, and this process's to FILE.{mutex,block}")
	settle := flag.Duration("settle", time.Second, "pause between the round and the injected fault: each agent starts its round's watches in the background once Next returns, and a real fault does not come within milliseconds")
	tracef := flag.String("trace", "", "write this process's execution trace (agents and clients) of the last run's round and re-form phases here (go tool trace)")
	serveProf := flag.String("serve-cpuprofile", "", "internal: with -serve, the server's CPU profile")
	serveLock := flag.String("serve-lockprofile", "", "internal: with -serve, the server's mutex and block profiles (.mutex, .block)")
	flag.Parse()

	if *serve {
		if err := serveStore(*serveProf, *serveLock, *verbose); err != nil {
			fmt.Fprintln(os.Stderr, "rdzvscale -serve:", err)
			os.Exit(1)
		}
		return
	}

	o := options{settle: *settle, trace: *tracef, lockprof: *lockprof, runs: *runs, ttl: *ttl, timeout: *timeout, nproc: *nproc, detail: *detail, verbose: *verbose, cpuprof: *cpuprof}
	for _, f := range strings.Split(*n, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v < 1 {
			fmt.Fprintf(os.Stderr, "rdzvscale: -n: bad count %q\n", f)
			os.Exit(2)
		}
		o.ns = append(o.ns, v)
	}
	for _, f := range strings.Split(*clients, ",") {
		f = strings.TrimSpace(f)
		if v, err := strconv.Atoi(f); f != "n" && (err != nil || v < 1) {
			fmt.Fprintf(os.Stderr, "rdzvscale: -clients: bad count %q (a number, or n)\n", f)
			os.Exit(2)
		}
		o.clients = append(o.clients, f)
	}
	if o.runs < 1 || o.ttl < time.Second || o.timeout <= 0 || o.nproc < 1 {
		fmt.Fprintln(os.Stderr, "rdzvscale: need -runs >= 1, -ttl >= 1s, -timeout > 0, -nproc >= 1")
		os.Exit(2)
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "rdzvscale:", err)
		os.Exit(1)
	}
	o.selfPath = self

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if o.cpuprof != "" {
		f, err := os.Create(o.cpuprof)
		if err != nil {
			fmt.Fprintln(os.Stderr, "rdzvscale:", err)
			os.Exit(1)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "rdzvscale:", err)
			os.Exit(1)
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	if o.lockprof != "" {
		startLockProfiles()
		defer writeLockProfiles(o.lockprof)
	}
	if !bench(ctx, o) {
		if o.lockprof != "" {
			writeLockProfiles(o.lockprof)
		}
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

// ---------------------------------------------------------------------------
// The etcd server, in a child process.

// serveStore is the child: it starts the embedded etcd, prints its
// endpoint, and serves until its stdin closes (the parent is done or
// gone). etcd's warnings go to stderr as JSON lines, for the parent to
// count.
// serverCounts is the line the child writes last: its warnings, counted.
type serverCounts struct {
	Counts   map[string]int    `json:"rdzvscale_counts"`
	Examples map[string]string `json:"examples"`
}

func serveStore(cpuprof, lockprof string, verbose bool) error {
	if lockprof != "" {
		startLockProfiles()
		defer writeLockProfiles(lockprof)
	}
	// etcd's warnings are counted here and sent to the parent once, at the
	// end: under load etcd warns thousands of times a second ("apply
	// request took too long"), and a pipe to a busy parent would block
	// etcd's goroutines on the logger's lock, which is not what is measured.
	warns := newTally()
	var next slog.Handler
	if verbose {
		next = slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})
	}
	log := slog.New(&countHandler{t: warns, who: "etcd server", next: next})
	defer func() {
		warns.mu.Lock()
		b, _ := json.Marshal(serverCounts{Counts: warns.m, Examples: warns.ex})
		warns.mu.Unlock()
		fmt.Fprintf(os.Stderr, "%s\n", b)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, err := store.Start(ctx, store.ServerConfig{ClientAddr: "127.0.0.1:0", Logger: log})
	if err != nil {
		return err
	}
	defer srv.Close()
	if cpuprof != "" {
		f, err := os.Create(cpuprof)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	fmt.Println(srv.Endpoint())
	_, _ = io.Copy(io.Discard, os.Stdin)
	return nil
}

// startLockProfiles samples contended locks and blocking (waits of 100 µs
// and more; shorter ones are scheduling noise here).
func startLockProfiles() {
	runtime.SetMutexProfileFraction(10)
	runtime.SetBlockProfileRate(int(100 * time.Microsecond))
}

func writeLockProfiles(prefix string) {
	for _, name := range []string{"mutex", "block"} {
		f, err := os.Create(prefix + "." + name)
		if err != nil {
			fmt.Fprintln(os.Stderr, "rdzvscale:", err)
			return
		}
		_ = pprof.Lookup(name).WriteTo(f, 0)
		f.Close()
	}
}

type server struct {
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	endpoint string
	logDone  chan struct{}
}

// startServer re-executes this program with -serve and waits for the
// endpoint it prints. etcd's warnings are tallied in warns.
func startServer(o options, prof, lockprof string, warns *tally) (*server, error) {
	args := []string{"-serve"}
	if o.verbose {
		args = append(args, "-v")
	}
	if prof != "" {
		args = append(args, "-serve-cpuprofile", prof)
	}
	if lockprof != "" {
		args = append(args, "-serve-lockprofile", lockprof)
	}
	cmd := exec.Command(o.selfPath, args...)
	// The child dies with this process, however it ends.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &server{cmd: cmd, stdin: stdin, logDone: make(chan struct{})}
	go func() {
		defer close(s.logDone)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			line := sc.Text()
			var c serverCounts
			if json.Unmarshal([]byte(line), &c) == nil && c.Counts != nil {
				for msg, n := range c.Counts {
					warns.addN(msg, c.Examples[msg], n)
				}
				continue
			}
			if o.verbose {
				fmt.Fprintln(os.Stderr, "etcd:", line)
			} else {
				warns.add("etcd server: "+line, "") // not a log record: a crash, most likely
			}
		}
	}()
	got := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		got <- strings.TrimSpace(line)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case ep := <-got:
		if ep == "" {
			s.stop()
			return nil, errors.New("the etcd child exited before serving")
		}
		s.endpoint = ep
		return s, nil
	case <-time.After(30 * time.Second):
		s.stop()
		return nil, errors.New("the etcd child did not serve within 30 s")
	}
}

// stop closes the child's stdin, which ends it (writing its profile), and
// kills it if it does not exit within 10 s.
func (s *server) stop() {
	s.stdin.Close()
	done := make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-done
	}
	select {
	case <-s.logDone:
	case <-time.After(time.Second):
	}
}

// mem returns the child's current and peak RSS, in bytes.
func (s *server) mem() (rss, hwm uint64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.cmd.Process.Pid))
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseUint(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			rss = v * 1024
		case "VmHWM:":
			hwm = v * 1024
		}
	}
	return rss, hwm
}

// cpu returns the child's CPU time (user + system) so far.
func (s *server) cpu() time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", s.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	// Fields after the command name, which is in parentheses and may hold spaces.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * (time.Second / 100) // USER_HZ is 100 on Linux
}

// cpuProbe spins GOMAXPROCS threads for d and returns how many cores they
// got. On a shared or oversubscribed VM it is well below GOMAXPROCS, and
// every figure of the run is slower for it.
func cpuProbe(d time.Duration) float64 {
	n := runtime.GOMAXPROCS(0)
	c0, t0 := selfCPU(), time.Now()
	var wg sync.WaitGroup
	var sink atomic.Int64
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := int64(0)
			for time.Since(t0) < d {
				for j := range int64(10000) {
					x += j
				}
			}
			sink.Add(x)
		}()
	}
	wg.Wait()
	return float64(selfCPU()-c0) / float64(time.Since(t0))
}

// selfCPU is this process's CPU time (user + system) so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// ---------------------------------------------------------------------------
// The server's counters, from its /metrics.

// metricNames are the server counters -detail reports. The grpc_server_*
// ones are kept per gRPC method.
var metricNames = []string{
	"grpc_server_msg_received_total",
	"grpc_server_msg_sent_total",
	"etcd_network_client_grpc_received_bytes_total",
	"etcd_network_client_grpc_sent_bytes_total",
	"etcd_server_proposals_committed_total",
	"etcd_server_slow_apply_total",
	"etcd_server_slow_read_indexes_total",
	"etcd_server_read_indexes_failed_total",
	"etcd_mvcc_range_total",
	"etcd_mvcc_txn_total",
	"etcd_mvcc_put_total",
	"etcd_mvcc_delete_total",
	"etcd_debugging_mvcc_events_total",
	"etcd_debugging_mvcc_slow_watcher_total",
	"etcd_debugging_mvcc_watcher_total",
	"etcd_debugging_mvcc_watch_stream_total",
	"etcd_debugging_lease_granted_total",
	"etcd_debugging_lease_renewed_total",
	"etcd_debugging_lease_revoked_total",
	"etcd_disk_backend_commit_duration_seconds_count",
}

var gauges = map[string]bool{
	"etcd_debugging_mvcc_slow_watcher_total": true,
	"etcd_debugging_mvcc_watcher_total":      true,
	"etcd_debugging_mvcc_watch_stream_total": true,
}

func scrape(endpoint string) map[string]float64 {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + endpoint + "/metrics")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	want := map[string]bool{}
	for _, n := range metricNames {
		want[n] = true
	}
	m := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, labels := line, ""
		if i := strings.IndexByte(line, '{'); i >= 0 {
			name = line[:i]
			if j := strings.IndexByte(line, '}'); j > i {
				labels = line[i+1 : j]
			}
		} else if i := strings.IndexByte(line, ' '); i >= 0 {
			name = line[:i]
		}
		if !want[name] {
			continue
		}
		rest := line[len(name):]
		if i := strings.LastIndexByte(rest, '}'); i >= 0 {
			rest = rest[i+1:]
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		key := name
		if strings.HasPrefix(name, "grpc_server_") {
			method := labelValue(labels, "grpc_method")
			if method == "" {
				continue
			}
			key = name + "{" + method + "}"
		}
		m[key] += v
	}
	return m
}

func labelValue(labels, name string) string {
	for _, kv := range strings.Split(labels, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok && k == name {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}

// ---------------------------------------------------------------------------
// Counting the agents' store requests (-detail).

type opStat struct {
	lat         []time.Duration
	first, last time.Duration // completions, from the start of the phase
	bytes       int64
	errs        int
}

type opStats struct {
	mu    sync.Mutex
	start time.Time
	m     map[string]*opStat
}

func newOpStats() *opStats { return &opStats{m: map[string]*opStat{}, start: time.Now()} }

func (s *opStats) add(kind string, d time.Duration, bytes int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.m[kind]
	at := time.Since(s.start)
	if st == nil {
		st = &opStat{first: at}
		s.m[kind] = st
	}
	st.last = at
	st.lat = append(st.lat, d)
	st.bytes += int64(bytes)
	if err != nil {
		st.errs++
	}
}

// tap is shared by the wrappers of every client: cur is the current
// phase's stats (nil: not counting).
type tap struct {
	prefix string
	cur    atomic.Pointer[opStats]
}

func (t *tap) add(kind string, start time.Time, bytes int, err error) {
	if s := t.cur.Load(); s != nil {
		s.add(kind, time.Since(start), bytes, err)
	}
}

func (t *tap) rel(key []byte) string {
	k := string(key)
	if k == rdzv.HostKey {
		return "host"
	}
	k = strings.TrimPrefix(k, t.prefix)
	if i := strings.IndexByte(k, '/'); i >= 0 {
		return k[:i+1] + "…"
	}
	return k
}

func (t *tap) opKind(op clientv3.Op) string {
	switch {
	case op.IsGet():
		s := "get " + t.rel(op.KeyBytes())
		if op.IsSortSet() {
			s += " sorted"
		}
		if op.Limit() > 0 {
			s += fmt.Sprintf(" limit %d", op.Limit())
		}
		if op.IsCountOnly() {
			s += " count"
		}
		return s
	case op.IsPut():
		return "put " + t.rel(op.KeyBytes())
	case op.IsDelete():
		return "delete " + t.rel(op.KeyBytes())
	}
	return "txn"
}

type kvTap struct {
	clientv3.KV
	t *tap
}

func (k kvTap) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	start := time.Now()
	resp, err := k.KV.Get(ctx, key, opts...)
	n := 0
	if resp != nil {
		for _, kv := range resp.Kvs {
			n += len(kv.Key) + len(kv.Value)
		}
	}
	k.t.add("Get: "+k.t.opKind(clientv3.OpGet(key, opts...)), start, n, err)
	return resp, err
}

func (k kvTap) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	start := time.Now()
	resp, err := k.KV.Put(ctx, key, val, opts...)
	k.t.add("Put: "+k.t.rel([]byte(key)), start, 0, err)
	return resp, err
}

func (k kvTap) Txn(ctx context.Context) clientv3.Txn {
	return &txnTap{txn: k.KV.Txn(ctx), t: k.t}
}

type txnTap struct {
	txn  clientv3.Txn
	t    *tap
	then []string
}

func (x *txnTap) If(cs ...clientv3.Cmp) clientv3.Txn { x.txn = x.txn.If(cs...); return x }
func (x *txnTap) Else(ops ...clientv3.Op) clientv3.Txn {
	x.txn = x.txn.Else(ops...)
	return x
}
func (x *txnTap) Then(ops ...clientv3.Op) clientv3.Txn {
	x.txn = x.txn.Then(ops...)
	for _, op := range ops {
		x.then = append(x.then, x.t.opKind(op))
	}
	return x
}
func (x *txnTap) Commit() (*clientv3.TxnResponse, error) {
	start := time.Now()
	resp, err := x.txn.Commit()
	n := 0
	if resp != nil {
		for _, r := range resp.Responses {
			if rr := r.GetResponseRange(); rr != nil {
				for _, kv := range rr.Kvs {
					n += len(kv.Key) + len(kv.Value)
				}
			}
		}
	}
	x.t.add("Txn: "+strings.Join(x.then, ", "), start, n, err)
	return resp, err
}

type leaseTap struct {
	clientv3.Lease
	t *tap
}

func (l leaseTap) Grant(ctx context.Context, ttl int64) (*clientv3.LeaseGrantResponse, error) {
	start := time.Now()
	resp, err := l.Lease.Grant(ctx, ttl)
	l.t.add("Lease: grant", start, 0, err)
	return resp, err
}

func (l leaseTap) Revoke(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseRevokeResponse, error) {
	start := time.Now()
	resp, err := l.Lease.Revoke(ctx, id)
	l.t.add("Lease: revoke", start, 0, err)
	return resp, err
}

type watchTap struct {
	clientv3.Watcher
	t *tap
}

func (w watchTap) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	what := w.t.rel([]byte(key))
	w.t.add("Watch: "+what, time.Now(), 0, nil)
	in := w.Watcher.Watch(ctx, key, opts...)
	// Forward the responses, noting when events arrive and their size.
	out := make(chan clientv3.WatchResponse)
	go func() {
		defer close(out)
		for resp := range in {
			if len(resp.Events) > 0 {
				n := 0
				for _, ev := range resp.Events {
					n += len(ev.Kv.Key) + len(ev.Kv.Value)
				}
				w.t.add("Watch event: "+what, time.Now(), n, nil)
			}
			select {
			case out <- resp:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// ---------------------------------------------------------------------------
// Warnings and errors: counted always, printed with -v.

type tally struct {
	mu sync.Mutex
	m  map[string]int
	ex map[string]string // one example error per message
}

func newTally() *tally { return &tally{m: map[string]int{}, ex: map[string]string{}} }

func (t *tally) add(msg, example string) { t.addN(msg, example, 1) }

func (t *tally) addN(msg, example string, n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.m[msg] += n
	if _, ok := t.ex[msg]; !ok && example != "" {
		t.ex[msg] = example
	}
}

func (t *tally) snapshot() map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := make(map[string]int, len(t.m))
	for k, v := range t.m {
		c[k] = v
	}
	return c
}

// countHandler counts the records of Warn and above by message (the
// agents' and the clients'), and passes every record to next when -v.
type countHandler struct {
	t     *tally
	who   string
	next  slog.Handler // nil: discard
	attrs []slog.Attr
}

func (h *countHandler) Enabled(_ context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn || h.next != nil
}

func (h *countHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		ex := ""
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "err" || a.Key == "error" {
				ex = a.Value.String()
				return false
			}
			return true
		})
		h.t.add(h.who+" "+r.Level.String()+": "+r.Message, ex)
	}
	if h.next != nil {
		return h.next.Handle(ctx, r)
	}
	return nil
}

func (h *countHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	if h.next != nil {
		c.next = h.next.WithAttrs(as)
	}
	return &c
}

func (h *countHandler) WithGroup(name string) slog.Handler {
	c := *h
	if h.next != nil {
		c.next = h.next.WithGroup(name)
	}
	return &c
}

// ---------------------------------------------------------------------------
// One run.

type phase struct {
	name           string
	wall           time.Duration
	srvCPU, cliCPU time.Duration
	ops            *opStats
	metrics        map[string]float64 // deltas
	srvRSS         uint64             // server RSS at the end of the phase
}

type result struct {
	n, k                int
	ok                  bool
	failed              string // which phase failed, and why
	open, round, reform time.Duration
	roundFirst          time.Duration // the first Next to return
	reformFirst         time.Duration
	srvHWM              uint64
	srvCPU              time.Duration
	cores               float64 // what the CPU probe before the run got
	phases              []phase
	warns               map[string]int
	examples            map[string]string
	stateBytes          int // the state key's value once the round closed
}

type agent struct {
	e    *rdzv.Etcd
	r1   *rdzv.Round
	t1   time.Time
	err1 error

	// Written by the agent's goroutine during the re-formation.
	mu     sync.Mutex
	ended  time.Time // when r1's Done closed
	r2     *rdzv.Round
	t2     time.Time
	err2   error
	broken []string // why rounds after r1 ended (another fault during the re-formation)
}

// latest returns the agent's latest round of the re-formation.
func (a *agent) latest() (*rdzv.Round, time.Time, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.r2, a.t2, a.err2
}

func runOnce(ctx context.Context, o options, n, k, run int) (res result) {
	res = result{n: n, k: k}
	warns := newTally()
	defer func() {
		res.warns = warns.snapshot()
		warns.mu.Lock()
		res.examples = make(map[string]string, len(warns.ex))
		for m, e := range warns.ex {
			res.examples[m] = e
		}
		warns.mu.Unlock()
	}()
	fail := func(ph string, err error) result {
		res.failed = ph + ": " + err.Error()
		return res
	}

	res.cores = cpuProbe(300 * time.Millisecond)
	prof := ""
	if o.cpuprof != "" {
		prof = fmt.Sprintf("%s.etcd.n%d.k%d.r%d", o.cpuprof, n, k, run)
	}
	lockprof := ""
	if o.lockprof != "" {
		lockprof = fmt.Sprintf("%s.etcd.n%d.k%d.r%d", o.lockprof, n, k, run)
	}
	srv, err := startServer(o, prof, lockprof, warns)
	if err != nil {
		return fail("start etcd", err)
	}
	defer srv.stop()

	var next slog.Handler
	if o.verbose {
		next = slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})
	}
	agentLog := slog.New(&countHandler{t: warns, who: "agent", next: next})
	clientLog := slog.New(&countHandler{t: warns, who: "etcd client", next: next})

	prefix := rdzv.Prefix(rdzv.RootPrefix, jobID)
	tp := &tap{prefix: prefix}

	// Clients: dialled before the clock starts (a real agent dials before
	// it opens the rendezvous), 32 at a time.
	clis := make([]*clientv3.Client, k)
	{
		dctx, cancel := context.WithTimeout(ctx, o.timeout)
		var wg sync.WaitGroup
		sem := make(chan struct{}, 32)
		errs := make([]error, k)
		for i := range clis {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				clis[i], errs[i] = store.Dial(dctx, store.ClientConfig{Endpoints: []string{srv.endpoint}, Logger: clientLog})
			}()
		}
		wg.Wait()
		cancel()
		defer func() {
			for _, c := range clis {
				if c != nil {
					c.Close()
				}
			}
		}()
		if err := errors.Join(errs...); err != nil {
			return fail("dial", err)
		}
		if o.detail {
			for _, c := range clis {
				c.KV = kvTap{KV: c.KV, t: tp}
				c.Lease = leaseTap{Lease: c.Lease, t: tp}
				c.Watcher = watchTap{Watcher: c.Watcher, t: tp}
			}
		}
	}

	// begin brackets a phase with the server's and this process's CPU,
	// and with -detail its requests and the server's counters.
	begin := func(name string) func() phase {
		p := phase{name: name}
		var m0 map[string]float64
		if o.detail {
			m0 = scrape(srv.endpoint)
			p.ops = newOpStats()
			tp.cur.Store(p.ops)
		}
		s0, c0, t0 := srv.cpu(), selfCPU(), time.Now()
		return func() phase {
			p.wall = time.Since(t0)
			p.srvCPU, p.cliCPU = srv.cpu()-s0, selfCPU()-c0
			p.srvRSS, _ = srv.mem()
			if o.detail {
				tp.cur.Store(nil)
				m1 := scrape(srv.endpoint)
				p.metrics = map[string]float64{}
				for key, v := range m1 {
					if gauges[key] {
						p.metrics[key] = v
					} else if d := v - m0[key]; d != 0 {
						p.metrics[key] = d
					}
				}
			}
			res.phases = append(res.phases, p)
			return p
		}
	}
	srvCPU0 := srv.cpu()
	defer func() { res.srvCPU = srv.cpu() - srvCPU0; _, res.srvHWM = srv.mem() }()

	// Open.
	agents := make([]*agent, n)
	for i := range agents {
		agents[i] = &agent{}
	}
	defer func() {
		// Teardown, bounded: end the rounds' watches and keep-alives.
		var wg sync.WaitGroup
		for _, a := range agents {
			if a.e == nil {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				r2, _, _ := a.latest()
				for _, r := range []*rdzv.Round{a.r1, r2} {
					if r != nil {
						r.Stop()
					}
				}
				a.e.Close()
			}()
		}
		waitBounded(&wg, 10*time.Second)
	}()
	{
		end := begin("open")
		octx, cancel := context.WithTimeout(ctx, o.timeout)
		var wg sync.WaitGroup
		errs := make([]error, n)
		t0 := time.Now()
		for i, a := range agents {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cfg := rdzv.Config{
					JobID: jobID, Prefix: prefix, Hosted: i == 0, Endpoint: srv.endpoint,
					Host: fmt.Sprintf("node%05d", i), Addr: "127.0.0.1", NProc: o.nproc,
					NNodesMin: n, NNodesMax: n, MaxRestarts: 100,
					JoinTimeout: o.timeout, LastCall: time.Second, TTL: o.ttl,
					Logger: agentLog,
				}
				a.e, errs[i] = rdzv.Open(octx, clis[i%k], cfg)
			}()
		}
		ok := waitBounded(&wg, o.timeout+15*time.Second)
		res.open = time.Since(t0)
		cancel()
		end()
		if !ok {
			return fail("open", fmt.Errorf("Open did not return within %v", o.timeout+15*time.Second))
		}
		if err := firstErrors(errs); err != nil {
			return fail("open", err)
		}
	}

	// Round, then re-form: one goroutine per agent for both, so that the
	// agents call Next again as soon as their round ends, as real ones do.
	rctx, rcancel := context.WithCancel(ctx)
	defer rcancel()
	fctx, fcancel := context.WithCancel(ctx)
	defer fcancel()
	start := make(chan struct{})
	var startOnce sync.Once
	startAll := func() { startOnce.Do(func() { close(start) }) }
	var roundWG, allWG sync.WaitGroup
	for _, a := range agents {
		roundWG.Add(1)
		allWG.Add(1)
		go func() {
			defer allWG.Done()
			<-start
			a.r1, a.err1 = a.e.Next(rctx)
			a.t1 = time.Now()
			roundWG.Done()
			if a.err1 != nil {
				return
			}
			// Follow the job as a real agent does: whenever the round
			// ends, ask for the next one.
			r := a.r1
			for {
				select {
				case <-r.Done():
				case <-fctx.Done():
					return
				}
				a.mu.Lock()
				if r == a.r1 {
					a.ended = time.Now()
				} else {
					a.broken = append(a.broken, r.Reason())
				}
				a.mu.Unlock()
				nr, err := a.e.Next(fctx)
				a.mu.Lock()
				a.r2, a.t2, a.err2 = nr, time.Now(), err
				a.mu.Unlock()
				if err != nil {
					return
				}
				r = nr
			}
		}()
	}
	defer func() {
		rcancel()
		fcancel()
		startAll()
		waitBounded(&allWG, 15*time.Second)
	}()

	if o.trace != "" && run == o.runs {
		if f, err := os.Create(o.trace); err == nil {
			if trace.Start(f) == nil {
				defer func() { trace.Stop(); f.Close() }()
			} else {
				f.Close()
			}
		}
	}
	end := begin("round")
	stop := time.AfterFunc(o.timeout, rcancel)
	t0 := time.Now()
	startAll()
	ok := waitBounded(&roundWG, o.timeout+15*time.Second)
	stop.Stop()
	end()
	if !ok {
		return fail("round", fmt.Errorf("Next did not return within %v", o.timeout+15*time.Second))
	}
	errs := make([]error, n)
	for i, a := range agents {
		errs[i] = a.err1
	}
	if err := firstErrors(errs); err != nil {
		return fail("round", err)
	}
	res.round, res.roundFirst = spread(t0, agents, func(a *agent) time.Time { return a.t1 })
	if err := checkRound(agents, n, o.nproc, func(a *agent) *rdzv.Round { return a.r1 }, nil); err != nil {
		return fail("round", err)
	}
	res.stateBytes = stateSize(clis[0], prefix)

	// Re-form after a fault: an agent in the middle of the list fails.
	if !sleepCtx(ctx, o.settle) {
		return fail("re-form", context.Cause(ctx))
	}
	end = begin("re-form")
	stop = time.AfterFunc(o.timeout, fcancel)
	t0 = time.Now()
	faulty := agents[n/2]
	ferr := faulty.e.Fail(fctx, faulty.r1, "rdzvscale: injected worker failure")
	var werr error
	if ferr == nil {
		werr = waitReformed(fctx, agents)
	}
	stop.Stop()
	end()
	if ferr != nil {
		return fail("re-form", fmt.Errorf("Fail: %w", ferr))
	}
	if werr != nil {
		return fail("re-form", werr)
	}
	// A round that broke before the fault (a lost lease, most often) makes
	// the re-formation measure something else.
	early := map[string]int{}
	for _, a := range agents {
		a.mu.Lock()
		if !a.ended.IsZero() && a.ended.Before(t0) {
			early[a.r1.Reason()]++
		}
		a.mu.Unlock()
	}
	if len(early) > 0 {
		var parts []string
		for why, c := range early {
			parts = append(parts, fmt.Sprintf("%d agents: %s", c, why))
		}
		sort.Strings(parts)
		return fail("re-form", fmt.Errorf("the round ended before the injected fault: %s", strings.Join(parts, "; ")))
	}
	broken := map[string]int{}
	for _, a := range agents {
		a.mu.Lock()
		for _, why := range a.broken {
			broken[why]++
		}
		a.mu.Unlock()
	}
	if len(broken) > 0 {
		var parts []string
		for why, c := range broken {
			parts = append(parts, fmt.Sprintf("%d agents: %s", c, why))
		}
		sort.Strings(parts)
		return fail("re-form", fmt.Errorf("re-formed more than once: after the injected fault, the new round ended again: %s", strings.Join(parts, "; ")))
	}
	res.reform, res.reformFirst = spread(t0, agents, func(a *agent) time.Time { _, t, _ := a.latest(); return t })
	if err := checkRound(agents, n, o.nproc, func(a *agent) *rdzv.Round { r, _, _ := a.latest(); return r }, func(a *agent) *rdzv.Round { return a.r1 }); err != nil {
		return fail("re-form", err)
	}
	res.ok = true
	return res
}

// waitReformed waits until every agent holds a running round of one
// generation after the fault, an agent's Next fails, or ctx ends.
func waitReformed(ctx context.Context, agents []*agent) error {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		done := true
		gens := map[uint64]bool{}
		var errs []error
		for _, a := range agents {
			r, _, err := a.latest()
			switch {
			case err != nil:
				errs = append(errs, err)
			case r == nil:
				done = false
			default:
				select {
				case <-r.Done():
					done = false
				default:
				}
				gens[r.Generation] = true
			}
		}
		done = done && len(gens) == 1
		if err := firstErrors(errs); err != nil {
			return err
		}
		if done {
			return nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			n := 0
			for _, a := range agents {
				if r, _, _ := a.latest(); r != nil {
					n++
				}
			}
			return fmt.Errorf("not re-formed within the timeout (%d of %d agents got a next round): %w", n, len(agents), context.Cause(ctx))
		}
	}
}

// spread returns the time from t0 to the last and to the first of the
// agents' times.
func spread(t0 time.Time, agents []*agent, at func(*agent) time.Time) (last, first time.Duration) {
	first = time.Duration(1<<63 - 1)
	for _, a := range agents {
		d := at(a).Sub(t0)
		last, first = max(last, d), min(first, d)
	}
	return last, first
}

// checkRound checks that every agent got the same generation, that the
// group ranks are 0..n-1 once each, and, with prev, that the generation is
// prev's plus one and every agent kept its group rank.
func checkRound(agents []*agent, n, nproc int, cur, prev func(*agent) *rdzv.Round) error {
	seen := make([]bool, n)
	gen := cur(agents[0]).Generation
	for i, a := range agents {
		r := cur(a)
		switch {
		case r.Generation != gen:
			return fmt.Errorf("agent %d got generation %d, agent 0 got %d", i, r.Generation, gen)
		case r.NNodes != n:
			return fmt.Errorf("agent %d: round of %d nodes, want %d", i, r.NNodes, n)
		case r.RankOffset != r.GroupRank*nproc:
			return fmt.Errorf("agent %d: rank offset %d for group rank %d", i, r.RankOffset, r.GroupRank)
		case r.WorldSize != n*nproc:
			return fmt.Errorf("agent %d: world size %d, want %d", i, r.WorldSize, n*nproc)
		case r.GroupRank < 0 || r.GroupRank >= n || seen[r.GroupRank]:
			return fmt.Errorf("agent %d: group rank %d out of range or taken twice", i, r.GroupRank)
		}
		seen[r.GroupRank] = true
		if prev != nil {
			p := prev(a)
			if r.Generation != p.Generation+1 {
				return fmt.Errorf("agent %d: generation %d after %d", i, r.Generation, p.Generation)
			}
			if r.Restarts != p.Restarts+1 {
				return fmt.Errorf("agent %d: restarts went from %d to %d: another fault than the injected one counted", i, p.Restarts, r.Restarts)
			}
			if r.GroupRank != p.GroupRank {
				return fmt.Errorf("agent %d: group rank %d, was %d (ranks should be stable)", i, r.GroupRank, p.GroupRank)
			}
		}
	}
	return nil
}

// stateSize is the size of the state value: what every watcher of the
// state key and every reader of it gets, each time it changes.
func stateSize(cli *clientv3.Client, prefix string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.KV.Get(ctx, prefix+"state")
	if err != nil || len(resp.Kvs) == 0 {
		return 0
	}
	return len(resp.Kvs[0].Value)
}

// firstErrors joins the distinct errors of errs, with counts.
func firstErrors(errs []error) error {
	count := map[string]int{}
	var order []string
	for _, err := range errs {
		if err == nil {
			continue
		}
		s := err.Error()
		if count[s] == 0 {
			order = append(order, s)
		}
		count[s]++
	}
	if len(order) == 0 {
		return nil
	}
	var parts []string
	for i, s := range order {
		if i == 5 {
			parts = append(parts, fmt.Sprintf("and %d other errors", len(order)-5))
			break
		}
		parts = append(parts, fmt.Sprintf("%d agents: %s", count[s], s))
	}
	return errors.New(strings.Join(parts, "; "))
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func waitBounded(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// ---------------------------------------------------------------------------
// The runs and the report.

// key is one configuration: N agents sharing K clients.
type key struct{ n, k int }

func bench(ctx context.Context, o options) bool {
	var keys []key
	results := map[key][]result{}
	for _, n := range o.ns {
		for _, c := range o.clients {
			k := n
			if c != "n" {
				k, _ = strconv.Atoi(c)
				k = min(k, n)
			}
			if !slices.Contains(keys, key{n, k}) {
				keys = append(keys, key{n, k})
			}
		}
	}
	allOK := true
	for _, kk := range keys {
		for run := 1; run <= o.runs; run++ {
			if ctx.Err() != nil {
				fmt.Fprintln(os.Stderr, "rdzvscale: interrupted")
				return false
			}
			r := runOnce(ctx, o, kk.n, kk.k, run)
			results[kk] = append(results[kk], r)
			if r.ok {
				fmt.Fprintf(os.Stderr, "N=%d clients=%d run %d/%d: open %v, round %v (first agent %v), re-form %v (first %v), etcd peak RSS %s, etcd CPU %v, CPU probe %.2f cores\n",
					kk.n, kk.k, run, o.runs, ms(r.open), ms(r.round), ms(r.roundFirst), ms(r.reform), ms(r.reformFirst), mib(r.srvHWM), ms(r.srvCPU), r.cores)
			} else {
				allOK = false
				fmt.Fprintf(os.Stderr, "N=%d clients=%d run %d/%d: FAILED (CPU probe %.2f cores): %s\n", kk.n, kk.k, run, o.runs, r.cores, r.failed)
			}
		}
	}

	fmt.Printf("\n## Rendezvous at scale: one embedded etcd, N simulated agents (medians of %d runs)\n\n", o.runs)
	fmt.Printf("Goal (issue): one round of 1024 agents in under %v. No torchrun baseline: its c10d rendezvous cannot run 1024 agents on one machine.\n", goal)
	fmt.Printf("Lease TTL %v, %d workers per agent; etcd in its own process (RSS and CPU are the server's alone); GOMAXPROCS %d.\n", o.ttl, o.nproc, runtime.GOMAXPROCS(0))
	fmt.Printf("CPU probe: what %d busy threads got just before each run, in cores (on a shared VM it is below %d, and everything is slower for it).\n\n", runtime.GOMAXPROCS(0), runtime.GOMAXPROCS(0))
	fmt.Println("| N | clients | runs ok | open | round | re-form | round ÷ 2 s goal | re-form ÷ 2 s goal | state value | etcd peak RSS | etcd CPU per run | CPU probe |")
	fmt.Println("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, kk := range keys {
		all := results[kk]
		var ok []result
		for _, r := range all {
			if r.ok {
				ok = append(ok, r)
			}
		}
		med := func(rs []result, f func(result) time.Duration) time.Duration {
			v := make([]time.Duration, 0, len(rs))
			for _, r := range rs {
				if d := f(r); d > 0 {
					v = append(v, d)
				}
			}
			if len(v) == 0 {
				return 0
			}
			return median(v)
		}
		cores := make([]time.Duration, len(all))
		for i, r := range all {
			cores[i] = time.Duration(r.cores * 1000)
		}
		probe := fmt.Sprintf("%.2f", float64(median(cores))/1000)
		if len(ok) == 0 {
			// Say where the runs failed; the open phase may still have a time.
			cell := func(phase string) string {
				n := 0
				for _, r := range all {
					if strings.HasPrefix(r.failed, phase+":") {
						n++
					}
				}
				if n == 0 {
					return "–"
				}
				return fmt.Sprintf("failed ×%d", n)
			}
			open := "–"
			if d := med(all, func(r result) time.Duration { return r.open }); d > 0 && cell("open") == "–" {
				open = ms(d).String()
			}
			fmt.Printf("| %d | %d | 0/%d | %s | %s | %s | – | – | – | %s | %v | %s |\n", kk.n, kk.k, len(all), open, cell("round"), cell("re-form"),
				mib(uint64(med(all, func(r result) time.Duration { return time.Duration(r.srvHWM) }))), ms(med(all, func(r result) time.Duration { return r.srvCPU })), probe)
			continue
		}
		open, round, reform := med(ok, func(r result) time.Duration { return r.open }), med(ok, func(r result) time.Duration { return r.round }), med(ok, func(r result) time.Duration { return r.reform })
		fmt.Printf("| %d | %d | %d/%d | %v | %v | %v | %.2f | %.2f | %s | %s | %v | %s |\n", kk.n, kk.k, len(ok), len(all),
			ms(open), ms(round), ms(reform), float64(round)/float64(goal), float64(reform)/float64(goal),
			kib(ok[0].stateBytes), mib(uint64(med(ok, func(r result) time.Duration { return time.Duration(r.srvHWM) }))),
			ms(med(ok, func(r result) time.Duration { return r.srvCPU })), probe)
	}
	fmt.Println()
	fmt.Println("open: N agents call rdzv.Open at once, until the last returns. round: all call Next at once, until the last returns (NNodesMin = NNodesMax = N).")
	fmt.Printf("re-form: %v after the round, one agent calls Fail(round); every agent calls Next again whenever its Round's Done() closes; until all hold a running round of one generation.\n", o.settle)
	fmt.Println("state value: the size of the state key once the round closed, which every watcher and reader of it receives each time it changes.")

	// Failures, then warnings and errors seen.
	for _, kk := range keys {
		for i, r := range results[kk] {
			if !r.ok {
				fmt.Printf("\nN=%d clients=%d run %d failed: %s\n", kk.n, kk.k, i+1, r.failed)
			}
		}
	}
	printWarnings(keys, results)

	if o.detail {
		for _, kk := range keys {
			rs := results[kk]
			r := rs[len(rs)-1]
			printDetail(r, len(rs))
		}
	}
	return allOK
}

func printWarnings(keys []key, results map[key][]result) {
	header := false
	for _, kk := range keys {
		sum := map[string]int{}
		ex := map[string]string{}
		for _, r := range results[kk] {
			for m, c := range r.warns {
				sum[m] += c
				if e, ok := r.examples[m]; ok {
					ex[m] = e
				}
			}
		}
		if len(sum) == 0 {
			continue
		}
		if !header {
			fmt.Println("\n### Warnings and errors logged (all runs)")
			header = true
		}
		fmt.Printf("\nN=%d clients=%d:\n", kk.n, kk.k)
		msgs := make([]string, 0, len(sum))
		for m := range sum {
			msgs = append(msgs, m)
		}
		sort.Slice(msgs, func(a, b int) bool { return sum[msgs[a]] > sum[msgs[b]] })
		for _, m := range msgs {
			line := fmt.Sprintf("- %d × %s", sum[m], m)
			if e := ex[m]; e != "" {
				if len(e) > 200 {
					e = e[:200] + "…"
				}
				line += " (e.g. " + e + ")"
			}
			fmt.Println(line)
		}
	}
	if !header {
		fmt.Println("\nNo warnings or errors were logged by the agents, the clients or etcd.")
	}
}

func printDetail(r result, runs int) {
	fmt.Printf("\n### Detail: N=%d clients=%d, run %d\n\n", r.n, r.k, runs)
	if !r.ok {
		fmt.Printf("(this run failed: %s)\n\n", r.failed)
	}
	fmt.Println("| phase | wall | etcd CPU | bench CPU (agents+clients) | etcd RSS after |")
	fmt.Println("|---|---:|---:|---:|---:|")
	for _, p := range r.phases {
		fmt.Printf("| %s | %v | %v | %v | %s |\n", p.name, ms(p.wall), ms(p.srvCPU), ms(p.cliCPU), mib(p.srvRSS))
	}
	for _, p := range r.phases {
		fmt.Printf("\n%s: the agents' store requests\n\n", p.name)
		fmt.Println("| request | count | p50 | p99 | max | first done | last done | bytes read |")
		fmt.Println("|---|---:|---:|---:|---:|---:|---:|---:|")
		if p.ops != nil {
			p.ops.mu.Lock()
			kinds := make([]string, 0, len(p.ops.m))
			for k := range p.ops.m {
				kinds = append(kinds, k)
			}
			sort.Strings(kinds)
			for _, k := range kinds {
				st := p.ops.m[k]
				lat := slices.Clone(st.lat)
				slices.Sort(lat)
				errs := ""
				if st.errs > 0 {
					errs = fmt.Sprintf(" (%d errors)", st.errs)
				}
				if strings.HasPrefix(k, "Watch") {
					fmt.Printf("| %s | %d | | | | %v | %v | |\n", k, len(lat), ms(st.first), ms(st.last))
					continue
				}
				fmt.Printf("| %s%s | %d | %v | %v | %v | %v | %v | %s |\n", k, errs, len(lat), ms(pct(lat, 50)), ms(pct(lat, 99)), ms(lat[len(lat)-1]), ms(st.first), ms(st.last), kib(int(st.bytes)))
			}
			p.ops.mu.Unlock()
		}
		if len(p.metrics) > 0 {
			fmt.Printf("\n%s: the etcd server's counters (increase over the phase; watcher gauges at its end)\n\n", p.name)
			keys := make([]string, 0, len(p.metrics))
			for k := range p.metrics {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				v := p.metrics[k]
				if strings.HasSuffix(k, "_bytes_total") {
					fmt.Printf("- %s: %s\n", k, mib(uint64(v)))
				} else {
					fmt.Printf("- %s: %.0f\n", k, v)
				}
			}
		}
	}
}

func pct(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := (len(sorted) - 1) * p / 100
	return sorted[i]
}

func median(v []time.Duration) time.Duration {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func ms(d time.Duration) time.Duration {
	if d < 10*time.Millisecond {
		return d.Round(10 * time.Microsecond)
	}
	return d.Round(time.Millisecond)
}

func mib(b uint64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
func kib(b int) string    { return fmt.Sprintf("%.1f KiB", float64(b)/1024) }
