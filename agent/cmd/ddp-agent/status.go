package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/launch"
	"github.com/ddp-agent/ddp-agent/agent/rdzv"
	"github.com/ddp-agent/ddp-agent/agent/rdzv/store"
	"github.com/ddp-agent/ddp-agent/agent/telemetry"
	"github.com/ddp-agent/ddp-agent/internal/envname"
)

const statusUsage = `Usage: ddp-agent status --rdzv-endpoint HOST:PORT[,HOST:PORT...] [flags]

Shows a job's rendezvous as the store holds it: its generation, run and phase,
the nodes of the current round with their group ranks and ranks, spares,
nodes lost, who has joined an open round, and the stalls, persistent
stragglers and hangs the agents saw among their workers. It only reads
the store.

Flags (torchrun's underscore spelling works too: --rdzv_endpoint):
  --rdzv-endpoint LIST   the store: host:port of the agent that hosts it (c10d,
                         default port 29400) or etcd members (etcd, default port 2379)
  --rdzv-id ID           the job (also --run-id); default: the job the store was
                         started for, or its only job; with several, they are listed
  --rdzv-backend NAME    c10d or etcd, as given to ddp-agent run (default c10d)
  --rdzv-conf K=V,...    as given to ddp-agent run; status uses cacert, cert, key,
                         protocol and etcd_prefix
  --rdzv-token TOKEN     the job's --rdzv-token (default $DDP_AGENT_RDZV_TOKEN): with
                         one, the embedded store admits only clients that have it
  --json                 print one JSON object instead of a table
  --timeout DURATION     give up on a store that does not answer after this long
                         (default 5s); a refused connection fails at once

Exit codes: 0 the job (or the list of jobs) was shown; 1 the store is
unreachable or holds no such job; 2 usage error.
`

// statusFlags is a parsed `ddp-agent status` command line.
type statusFlags struct {
	endpoints []string
	id        string
	conf      launch.RdzvConf
	json      bool
	timeout   time.Duration
	token     string
	external  bool // --rdzv-backend etcd
}

var errStatusHelp = errors.New("help requested")

func parseStatusFlags(args []string) (*statusFlags, error) {
	f := &statusFlags{timeout: 5 * time.Second, token: os.Getenv(envname.RdzvToken)}
	backend, endpoint, conf := "c10d", "", ""
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "-h" || a == "--help" {
			return nil, errStatusHelp
		}
		if !strings.HasPrefix(a, "--") {
			return nil, fmt.Errorf("unexpected argument %q", a)
		}
		name, val, hasVal := strings.Cut(a, "=")
		name = strings.ReplaceAll(name[2:], "_", "-")
		if name == "json" {
			if hasVal {
				return nil, fmt.Errorf("--json takes no value, got %q", val)
			}
			f.json = true
			continue
		}
		if !hasVal {
			if i+1 >= len(args) {
				return nil, fmt.Errorf("flag --%s needs a value", name)
			}
			i++
			val = args[i]
		}
		switch name {
		case "rdzv-endpoint":
			endpoint = val
		case "rdzv-id", "run-id":
			f.id = val
		case "rdzv-backend":
			backend = val
		case "rdzv-conf":
			conf = val
		case "rdzv-token":
			f.token = val
		case "timeout":
			d, err := parseSeconds(val)
			if err != nil {
				return nil, fmt.Errorf("--timeout: %w", err)
			}
			f.timeout = d
		default:
			return nil, fmt.Errorf("unknown flag --%s", name)
		}
	}
	switch backend {
	case "c10d", "etcd":
	case "static":
		return nil, errors.New("--rdzv-backend static has no store to read; give the c10d or etcd backend the job runs with")
	default:
		return nil, fmt.Errorf("--rdzv-backend %q is not c10d or etcd", backend)
	}
	f.external = backend == "etcd"
	// launch fills in the backend's default port, as `ddp-agent run` does.
	f.endpoints = (&launch.Config{RdzvBackend: backend, RdzvEndpoint: endpoint}).Endpoints()
	if len(f.endpoints) == 0 {
		return nil, errors.New("--rdzv-endpoint is required: the store's host:port, as given to ddp-agent run")
	}
	if f.id != "" {
		if err := rdzv.CheckID(f.id); err != nil {
			return nil, err
		}
	}
	var err error
	if f.conf, err = launch.ParseRdzvConf(conf); err != nil {
		return nil, err
	}
	return f, nil
}

// parseSeconds reads a positive duration: seconds as a number, or a Go
// duration such as 500ms.
func parseSeconds(v string) (time.Duration, error) {
	if s, err := strconv.ParseFloat(v, 64); err == nil && s > 0 {
		return time.Duration(s * float64(time.Second)), nil
	}
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return d, nil
	}
	return 0, fmt.Errorf("%q is not a positive duration (seconds, or like 500ms)", v)
}

// tlsFiles is the TLS that --rdzv-conf asks for, as the agent reads it.
func tlsFiles(rc launch.RdzvConf) *store.TLSFiles {
	if rc.CACert == "" && rc.Cert == "" && rc.Protocol != "https" {
		return nil
	}
	return &store.TLSFiles{CertFile: rc.Cert, KeyFile: rc.Key, CAFile: rc.CACert}
}

// statusJSON is the --json form of one job: rdzv.Status (documented there)
// plus the endpoints read.
type statusJSON struct {
	Store []string `json:"store"`
	*rdzv.Status
}

// listJSON is the --json form of several jobs: rdzv.JobList plus the
// endpoints read.
type listJSON struct {
	Store []string `json:"store"`
	*rdzv.JobList
}

func runStatus(args []string, stdout, stderr io.Writer) int {
	f, err := parseStatusFlags(args)
	if errors.Is(err, errStatusHelp) {
		fmt.Fprint(stdout, statusUsage)
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "ddp-agent status: %v (see ddp-agent help status)\n", err)
		return 2
	}
	where := strings.Join(f.endpoints, ",")
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "ddp-agent status: "+format+"\n", a...)
		return 1
	}

	// One deadline for everything: Dial gets the whole timeout (it keeps
	// gRPC's reason for an unreachable store, which a cancelled context
	// would replace with a bare deadline error), the reads what is left.
	deadline := time.Now().Add(f.timeout)
	tlsCfg := tlsFiles(f.conf)
	if tlsCfg == nil && f.token != "" && !f.external {
		// The embedded store of a job with a token admits only the job's
		// certificates, which the token derives (as the agents do).
		job, err := store.OpenJobTLS(rdzv.StretchToken(f.token))
		if err != nil {
			return fail("%v", err)
		}
		defer job.Close()
		tlsCfg = job.Files
	}
	cli, err := store.Dial(context.Background(), store.ClientConfig{Endpoints: f.endpoints, TLS: tlsCfg, DialTimeout: f.timeout, RefusedIsFinal: true})
	if store.NothingListens(err) {
		// The whole of gRPC's account says no more than this.
		// A job of three nodes or more keeps its store on three of them:
		// the first host's address, given to every agent, dies with it.
		return fail("nothing listens at %s (connection refused): is the job running, and is this the --rdzv-endpoint (and backend) it was given?\n"+
			"  (a job of three nodes or more keeps its store on three of them: if that host died, give another node's address)", where)
	}
	if err != nil {
		const tcpStoreHint = "\n  (if that is a torchrun job's store, torch's TCPStore, ddp-agent status cannot read it: it reads the store of ddp-agent run, or an etcd)"
		// As the agents say it: a wrong token gave a bare x509 error.
		const tlsHint = "\n  (the store and this command do not accept each other's TLS: is --rdzv-token, or DDP_AGENT_RDZV_TOKEN, the job's, and --rdzv-conf's TLS files right?)"
		msg := err.Error()
		// Often torch's TCPStore answers there (torchrun's c10d rendezvous
		// port, or MASTER_PORT): it resets the connection (1.13) or says
		// nothing (2.x). A TLS store that a plain client reached closes
		// the connection, which reads as a reset too at times: then both
		// may be, and both hints go.
		tcpStore := strings.Contains(msg, "connection reset by peer") || strings.Contains(msg, "unreachable after") ||
			strings.Contains(msg, "gave no answer")
		switch tls := store.Refused(err); {
		case tcpStore && tls:
			return fail("%v"+tlsHint+tcpStoreHint, err)
		case tcpStore:
			return fail("%v"+tcpStoreHint, err)
		case tls:
			return fail("%v"+tlsHint, err)
		}
		return fail("%v", err)
	}
	defer cli.Close()
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	readErr := func(err error) int {
		if errors.Is(err, context.DeadlineExceeded) {
			return fail("rendezvous store at %s: no answer within --timeout %v: %v", where, f.timeout, err)
		}
		return fail("rendezvous store at %s: %v", where, err)
	}
	root := f.conf.Prefix

	id := f.id
	if id == "" {
		list, err := rdzv.ListJobs(ctx, cli, root)
		if err != nil {
			return readErr(err)
		}
		switch {
		case list.Hosted != "" && list.Has(list.Hosted):
			id = list.Hosted
		case len(list.Jobs) == 1:
			id = list.Jobs[0].ID
		case len(list.Jobs) == 0:
			return fail("no jobs in the store at %s (under %s)", where, root)
		default:
			if f.json {
				return writeJSON(stdout, stderr, listJSON{Store: f.endpoints, JobList: list})
			}
			renderJobList(stdout, list, where)
			return 0
		}
	}

	st, err := rdzv.ReadStatus(ctx, cli, root, id)
	if errors.Is(err, rdzv.ErrNoJob) {
		there := "no jobs there"
		if list, err := rdzv.ListJobs(ctx, cli, root); err == nil && len(list.Jobs) > 0 {
			there = "jobs there: " + strings.Join(list.IDs(), ", ")
		}
		return fail("no job %q in the store at %s (%s)", id, where, there)
	}
	if err != nil {
		return readErr(err)
	}
	st.ReadStoreMembers(ctx, cli)
	if f.json {
		return writeJSON(stdout, stderr, statusJSON{Store: f.endpoints, Status: st})
	}
	renderStatus(stdout, st, where, time.Now())
	return 0
}

func writeJSON(stdout, stderr io.Writer, v any) int {
	if err := json.NewEncoder(stdout).Encode(v); err != nil {
		fmt.Fprintf(stderr, "ddp-agent status: %v\n", err)
		return 1
	}
	return 0
}

// renderStatus writes st as people read it: a header of a few lines, then
// one line per node. now makes the ages reproducible in tests.
func renderStatus(w io.Writer, st *rdzv.Status, where string, now time.Time) {
	hosted := ""
	if st.Hosted {
		hosted = ", hosted for it"
	}
	fmt.Fprintf(w, "job %s (store %s%s)", st.ID, where, hosted)
	s := st.State
	if s == nil {
		fmt.Fprint(w, "   no readable state\n")
	} else {
		run := "" // the run a trace search for ddp.run keeps to
		if s.Run != "" {
			run = "   run " + s.Run
		}
		fmt.Fprintf(w, "   generation %d%s   %s since %s\n", s.Generation, run, s.Phase, since(s.Since, now))
	}

	nodesMin, nodesMax := "?", "?"
	if st.Job != nil {
		nodesMin, nodesMax = strconv.Itoa(st.Job.NNodesMin), strconv.Itoa(st.Job.NNodesMax)
	}
	var parts []string
	switch {
	case s != nil && s.Phase == rdzv.Joining:
		awaited := 0
		for _, n := range st.Nodes {
			if n.Role == rdzv.RoleJoining {
				awaited++
			}
		}
		parts = append(parts, fmt.Sprintf("joined %d (min %s, max %s)", st.Joined(), nodesMin, nodesMax),
			fmt.Sprintf("not yet joined %d", awaited))
	case s != nil:
		parts = append(parts, fmt.Sprintf("nodes %d (min %s, max %s)", len(s.Members), nodesMin, nodesMax),
			fmt.Sprintf("world size %d", s.WorldSize))
		if s.Phase == rdzv.Running && s.MasterAddr != "" {
			parts = append(parts, "master "+fmt.Sprintf("%s:%d", s.MasterAddr, s.MasterPort))
		}
	default:
		parts = append(parts, fmt.Sprintf("nodes min %s, max %s", nodesMin, nodesMax))
	}
	if s != nil {
		parts = append(parts, fmt.Sprintf("restarts %d of %d", s.Failures, s.MaxRestarts))
	}
	fmt.Fprintln(w, strings.Join(parts, "   "))
	if s != nil && s.Reason != "" {
		fmt.Fprintf(w, "last change: %s\n", s.Reason)
	}
	for _, m := range st.Malformed {
		fmt.Fprintf(w, "NOTE: %s\n", m.Error)
	}
	if len(st.Nodes) == 0 {
		fmt.Fprintln(w, "\nno nodes registered")
		return
	}

	// While a round is open, ranks are the last round's (survivors keep
	// theirs) and a node's ranks are not decided yet: show its workers.
	joining := s != nil && s.Phase == rdzv.Joining
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if joining {
		fmt.Fprintln(tw, "LAST RANK\tNODE\tHOST\tADDR\tNPROC\tPID\tSTATE")
	} else {
		fmt.Fprintln(tw, "GROUP RANK\tNODE\tHOST\tADDR\tRANKS\tPID\tSTATE")
	}
	leader := true // the first joiner leads the round; joiners come first in join order
	for _, n := range st.Nodes {
		rank, ranks, nproc, pid := "-", "-", "-", "-"
		if n.Member != nil {
			m := n.Member
			rank = strconv.Itoa(m.GroupRank)
			ranks = strconv.Itoa(m.RankOffset)
			if m.NProc > 1 {
				ranks += "-" + strconv.Itoa(m.RankOffset+m.NProc-1)
			}
			nproc = strconv.Itoa(m.NProc)
		}
		if n.Entry != nil {
			pid = strconv.Itoa(n.Entry.PID)
			nproc = strconv.Itoa(n.Entry.NProc)
		}
		if n.Join != nil {
			nproc = strconv.Itoa(n.Join.NProc)
		}
		state := string(n.Role)
		switch {
		case n.Role == rdzv.RoleLeft && n.Entry.Reason != "":
			state += ": " + n.Entry.Reason
		case n.Role == rdzv.RoleJoined && leader:
			state += ", leads the round"
			leader = false
		}
		col5 := ranks
		if joining {
			col5 = nproc
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", rank, n.Node, dash(n.Host()), dash(n.Addr()), col5, pid, state)
	}
	tw.Flush()
	renderStore(w, st)
	renderGPUs(w, st)
	renderStalls(w, st, now)
}

// renderStore lists the store's etcd members: who leads, who answers.
func renderStore(w io.Writer, st *rdzv.Status) {
	if len(st.Store) == 0 && st.StoreError == "" {
		return
	}
	fmt.Fprintln(w, "\nSTORE")
	if st.StoreError != "" {
		fmt.Fprintf(w, "members unknown: %s\n", st.StoreError)
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "MEMBER\tENDPOINTS\tROLE\tHEALTH\tDB")
	for _, m := range st.Store {
		role := "follower"
		switch {
		case m.Learner:
			role = "learner"
		case m.Leader:
			role = "leader"
		}
		health, db := "healthy", formatBytes(m.DBBytes)
		if !m.Healthy {
			health, db, role = "unreachable: "+m.Error, "-", "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", dash(m.Name), dash(strings.Join(m.Endpoints, ",")), role, health, db)
	}
	tw.Flush()
}

// formatBytes is "1.2 MiB".
func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// renderGPUs lists what each node's agent found of its GPUs and how it
// placed its workers; the per-worker details are in --json.
func renderGPUs(w io.Writer, st *rdzv.Status) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	header := false
	for _, n := range st.Nodes {
		if n.Entry == nil || n.Entry.GPUs == nil {
			continue
		}
		if !header {
			fmt.Fprintln(w, "\nGPUS")
			header = true
		}
		g := n.Entry.GPUs
		ring := make([]string, len(g.Ring))
		for i, r := range g.Ring {
			ring[i] = strconv.Itoa(r)
		}
		fmt.Fprintf(tw, "%s\t%s\tCUDA order %s\tNUMA binding %s\n", n.Node, g.Summary, dash(strings.Join(ring, ",")), dash(g.Binding))
	}
	tw.Flush()
}

// stallLines is how many of a node's last stall reports the table shows;
// --json has them all.
const stallLines = 3

// renderStalls lists, per node whose agent saw any, its persistent
// stragglers, its last stall reports, its last hang and its last
// in-process re-formation.
func renderStalls(w io.Writer, st *rdzv.Status, now time.Time) {
	header := false
	for _, n := range st.Nodes {
		if n.Stalls == nil {
			continue
		}
		s, err := telemetry.DecodeReport(n.Stalls)
		if err == nil && len(s.Stalls) == 0 && len(s.Stragglers) == 0 && s.Hang == "" && s.Reformed == "" {
			continue
		}
		if !header {
			fmt.Fprintln(w, "\nSTALLS")
			header = true
		}
		if err != nil {
			fmt.Fprintf(w, "%s\n  malformed: %v\n", n.Node, err)
			continue
		}
		if s.Updated.IsZero() {
			fmt.Fprintln(w, n.Node)
		} else {
			fmt.Fprintf(w, "%s  updated %s\n", n.Node, since(s.Updated, now))
		}
		for _, g := range s.Stragglers {
			fmt.Fprintf(w, "  persistent straggler: rank %d", g.Rank)
			if g.Host != "" {
				fmt.Fprintf(w, " on %s", g.Host)
			}
			if g.GPU != "" {
				fmt.Fprintf(w, " (GPU %s)", g.GPU)
			}
			fmt.Fprintf(w, ", held the others back in %d of %d steps", g.Last, g.Steps)
			if g.Share > 0 {
				fmt.Fprintf(w, " by %.0f ms, %.1f%% of step time", g.LateMS, 100*g.Share)
			}
			if g.Cause != "" {
				fmt.Fprintf(w, "; cause %s: %s", g.Cause, g.Evidence)
			}
			fmt.Fprintln(w)
		}
		lines := s.Stalls
		if len(lines) > stallLines {
			fmt.Fprintf(w, "  (%d earlier stalls in --json)\n", len(lines)-stallLines)
			lines = lines[len(lines)-stallLines:]
		}
		for _, l := range lines {
			fmt.Fprintf(w, "  stall: %s\n", l)
		}
		if s.Hang != "" {
			fmt.Fprintf(w, "  hang: %s\n", s.Hang)
		}
		if s.Reformed != "" {
			fmt.Fprintf(w, "  re-formed in process: %s\n", s.Reformed)
		}
	}
}

// renderJobList writes the jobs of a store that holds several.
func renderJobList(w io.Writer, l *rdzv.JobList, where string) {
	fmt.Fprintf(w, "%d jobs in the store at %s; give --rdzv-id to show one\n\n", len(l.Jobs), where)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tGENERATION\tPHASE\tNODES\tNOTE")
	for _, j := range l.Jobs {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%s\n", j.ID, j.Generation, dash(string(j.Phase)), j.Nodes, dash(j.Problem))
	}
	tw.Flush()
}

// since formats when something began, and how long ago: the clock time
// alone within the day, the date too before that.
func since(t, now time.Time) string {
	t = t.In(now.Location())
	layout := "15:04:05"
	if y, m, d := t.Date(); y != now.Year() || m != now.Month() || d != now.Day() {
		layout = "2006-01-02 15:04:05"
	}
	return fmt.Sprintf("%s (%v)", t.Format(layout), now.Sub(t).Round(time.Second))
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
