// Command rdzvscale measures the etcd rendezvous (agent/rdzv) at scale: N
// simulated agents, each running the real client code (rdzv.Open, then
// Next) against one embedded etcd (store.Start on 127.0.0.1:0), or with
// -members against a cluster of embedded members (store.StartCluster), as
// many agents as a job of N nodes has. It measures three things per run:
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
//	go run ./examples/bench/rdzvscale -n 16,256,1024 -clients n -members 1,3 -runs 3
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
// Members. -members 1,3 runs every N and client count against one etcd
// member and against a cluster of 3, side by side: the child started with
// -serve-members 3 runs store.StartCluster (3 members on loopback, in that
// one process) and prints every member's endpoint; each client is given
// them all, as an agent given a cluster's endpoints is. The member counts
// take turns run by run (run 1 of each, then run 2 of each, ...), so that
// a slow spell of the machine hits them alike. The table gets a row per
// member count, and a second table gives, per N and client count, the
// median open, round and re-form times against 3 members over those
// against 1 ("3 members / 1"), against the goal of the issue: within 1.5×
// at N=1024. The members share the machine's cores with each other and
// with the agents, and talk over loopback, where a real cluster has a host
// per member and a network: the etcd RSS and CPU are of all members
// together, as are -detail's server counters (scraped from the first
// member's /metrics, which in one process serves every member's: a write
// applied on each member counts once per member), and the etcd profiles
// (FILE.etcd.nN.kK.mM.rR) are of the whole child process.
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
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"
)

func main() {
	c := parseFlags()
	if c.serve.on {
		if err := serveStore(c.serve.members, c.serve.cpuprof, c.serve.lockprof, c.o.verbose); err != nil {
			fmt.Fprintln(os.Stderr, "rdzvscale -serve:", err)
			os.Exit(1)
		}
		return
	}
	o, err := c.options()
	if err != nil {
		fmt.Fprintln(os.Stderr, "rdzvscale:", err)
		os.Exit(2)
	}
	if o.selfPath, err = os.Executable(); err != nil {
		fmt.Fprintln(os.Stderr, "rdzvscale:", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, o)
	stop()
	os.Exit(code)
}

// run measures every configuration under this process's profiles, when
// asked for, and returns the exit code: 1 when a run failed.
func run(ctx context.Context, o options) int {
	if o.cpuprof != "" {
		f, err := os.Create(o.cpuprof)
		if err != nil {
			fmt.Fprintln(os.Stderr, "rdzvscale:", err)
			return 1
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "rdzvscale:", err)
			return 1
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	if o.lockprof != "" {
		startLockProfiles()
		defer writeLockProfiles(o.lockprof)
	}
	if !bench(ctx, o) {
		return 1
	}
	return 0
}
