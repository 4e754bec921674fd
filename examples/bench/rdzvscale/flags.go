package main

import (
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// goal is the target for one round of 1024 agents.
const goal = 2 * time.Second

const jobID = "rdzvscale"

// options is the command line of the parent: what to measure and how.
type options struct {
	ns       []int
	clients  []string // each a number or "n"
	members  []int    // etcd cluster sizes, each run against each
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

// serveFlags are the child's: whether to be the etcd server, of how many
// members, and where it writes its profiles.
type serveFlags struct {
	on                bool
	members           int
	cpuprof, lockprof string
}

// commandLine is the command line as parsed, before the counts are checked
// (the child has no use for them).
type commandLine struct {
	o                   options
	n, clients, members string
	serve               serveFlags
}

// parseFlags reads the command line.
func parseFlags() commandLine {
	var c commandLine
	flag.StringVar(&c.n, "n", "16,256,1024", "comma-separated agent counts")
	flag.StringVar(&c.clients, "clients", "64", "comma-separated: how many etcd clients the N agents share (each capped at N); \"n\" = one per agent, as in reality")
	flag.StringVar(&c.members, "members", "1", "comma-separated etcd cluster sizes: every N and client count runs against each (one run of each in turn); 1 = one embedded etcd, more = that many members on loopback in the etcd child")
	flag.IntVar(&c.o.runs, "runs", 3, "runs per N, client count and member count (medians are reported)")
	flag.DurationVar(&c.o.ttl, "ttl", 3*time.Second, "the agents' lease TTL (keep-alives go every TTL/3)")
	flag.DurationVar(&c.o.timeout, "timeout", 60*time.Second, "bound on each scenario (open, round, re-form) of a run")
	flag.IntVar(&c.o.nproc, "nproc", 8, "workers per simulated agent (only the size of the members list depends on it)")
	flag.BoolVar(&c.o.detail, "detail", false, "per phase: the agents' store requests and the etcd server's counters")
	flag.BoolVar(&c.o.verbose, "v", false, "the agents', clients' and etcd's logs to stderr")
	flag.StringVar(&c.o.cpuprof, "cpuprofile", "", "write this process's CPU profile (agents and clients) here, and each run's etcd server's to FILE.etcd.nN.kK.rR (FILE.etcd.nN.kK.mM.rR with M > 1 members: the one process of them all)")
	flag.BoolVar(&c.serve.on, "serve", false, "internal: be the etcd server of a parent rdzvscale")
	flag.StringVar(&c.o.lockprof, "lockprofile", "", "write each run's etcd server's mutex and block profiles to FILE.etcd.nN.kK.rR.{mutex,block} (nN.kK.mM.rR with M > 1 members), and this process's to FILE.{mutex,block}")
	flag.DurationVar(&c.o.settle, "settle", time.Second, "pause between the round and the injected fault: each agent starts its round's watches in the background once Next returns, and a real fault does not come within milliseconds")
	flag.StringVar(&c.o.trace, "trace", "", "write this process's execution trace (agents and clients) of the last run's round and re-form phases here (go tool trace)")
	flag.IntVar(&c.serve.members, "serve-members", 1, "internal: with -serve, how many etcd members to start")
	flag.StringVar(&c.serve.cpuprof, "serve-cpuprofile", "", "internal: with -serve, the server's CPU profile")
	flag.StringVar(&c.serve.lockprof, "serve-lockprofile", "", "internal: with -serve, the server's mutex and block profiles (.mutex, .block)")
	flag.Parse()
	return c
}

// options checks the counts and returns the parent's options.
func (c commandLine) options() (options, error) {
	o := c.o
	for _, f := range strings.Split(c.n, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v < 1 {
			return o, fmt.Errorf("-n: bad count %q", f)
		}
		o.ns = append(o.ns, v)
	}
	for _, f := range strings.Split(c.clients, ",") {
		f = strings.TrimSpace(f)
		if v, err := strconv.Atoi(f); f != "n" && (err != nil || v < 1) {
			return o, fmt.Errorf("-clients: bad count %q (a number, or n)", f)
		}
		o.clients = append(o.clients, f)
	}
	for _, f := range strings.Split(c.members, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v < 1 {
			return o, fmt.Errorf("-members: bad count %q", f)
		}
		if !slices.Contains(o.members, v) {
			o.members = append(o.members, v)
		}
	}
	if o.runs < 1 || o.ttl < time.Second || o.timeout <= 0 || o.nproc < 1 {
		return o, errors.New("need -runs >= 1, -ttl >= 1s, -timeout > 0, -nproc >= 1")
	}
	return o, nil
}
