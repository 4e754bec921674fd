// Command plugins measures what plugins cost the agent where it matters:
// its reaction to a worker's exit, with no plugin against an event storm
// beside the job, side by side in one run on one machine.
//
// The storm: a detector (storm/, as "storm") sends 1,000 warning findings
// a second for 10 s, each new, so the agent tells every one to its
// notifiers (1,000 events a second); a webhook notifier posts them to a
// server here that takes 50 ms to answer each (its queue fills, and drops
// are counted); a second detector ("slow") takes 2 s to answer Configure
// and each check. Both configurations run worker.py under
// `ddp-agent run --standalone --max-restarts 1`: the first attempt exits
// 1 after -fail-after (inside the storm), the second runs 3 s and exits 0.
//
// Reaction is measured two ways from the worker's own clock at its exit:
// to the agent's "worker failed" line (detection, the log's millisecond
// resolution), and to the restarted worker's first line of Python
// (recovery: the agent's restart plus Python's start). Runs alternate the
// two configurations; it prints medians with min and max, and the ratio.
//
//	go run ./examples/bench/plugins -agent bin/ddp-agent -python /usr/bin/python3 -runs 10
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

type config struct {
	agent, python string
	runs          int
	failAfter     time.Duration
	rate          int
	storm         time.Duration
	hookDelay     time.Duration
}

type sample struct{ detect, recover time.Duration }

func main() {
	var c config
	flag.StringVar(&c.agent, "agent", "bin/ddp-agent", "the ddp-agent binary (ddp-agent-plugins next to it)")
	flag.StringVar(&c.python, "python", "/usr/bin/python3", "the workers' Python")
	flag.IntVar(&c.runs, "runs", 10, "runs of each configuration")
	flag.DurationVar(&c.failAfter, "fail-after", 6*time.Second, "when the worker exits (the storm starts about 2 s before the worker)")
	flag.IntVar(&c.rate, "rate", 1000, "storm findings (notifier events) a second")
	flag.DurationVar(&c.storm, "for", 10*time.Second, "how long the storm lasts")
	flag.DurationVar(&c.hookDelay, "hook-delay", 50*time.Millisecond, "how long the webhook's server takes to answer")
	flag.Parse()
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "plugins bench:", err)
		os.Exit(1)
	}
}

func run(c config) error {
	agent, err := filepath.Abs(c.agent)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "plugins-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	storm := filepath.Join(dir, "storm")
	build := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", storm, "./examples/bench/plugins/storm")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build the storm plugin: %v\n%s", err, out)
	}
	slow := filepath.Join(dir, "slow")
	if err := os.Link(storm, slow); err != nil {
		return err
	}
	var posts atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		posts.Add(1)
		time.Sleep(c.hookDelay)
	}))
	defer srv.Close()
	stormArgs := []string{"--plugin", fmt.Sprintf("%s,rate=%d,for=%s", storm, c.rate, c.storm),
		"--plugin", slow + ",delay=2s", "--plugin", "webhook,url=" + srv.URL + ",timeout=1s,retries=0"}
	got := map[string][]sample{}
	var summaries []string
	for i := 0; i < c.runs; i++ {
		order := []string{"none", "storm"}
		if i%2 == 1 {
			order = []string{"storm", "none"}
		}
		for _, name := range order {
			var extra []string
			if name == "storm" {
				extra = stormArgs
			}
			s, summary, err := once(c, agent, dir, extra)
			if err != nil {
				return fmt.Errorf("run %d (%s): %w", i, name, err)
			}
			got[name] = append(got[name], s)
			if summary != "" {
				summaries = append(summaries, summary)
			}
			fmt.Fprintf(os.Stderr, "run %d %-5s detect %v recover %v %s\n", i, name, s.detect, s.recover, summary)
		}
	}
	report(c, got, summaries, posts.Load())
	return nil
}

var (
	failedRE  = regexp.MustCompile(`time=(\S+) level=ERROR msg="worker failed"`)
	summaryRE = regexp.MustCompile(`msg="notifier events".*`)
)

// once runs one job and measures its reaction to the worker's exit.
func once(c config, agent, dir string, extra []string) (sample, string, error) {
	out, err := os.MkdirTemp(dir, "run-")
	if err != nil {
		return sample{}, "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	wd, _ := os.Getwd()
	args := append([]string{"run", "--standalone", "--nproc-per-node", "1", "--max-restarts", "1", "--python", c.python}, extra...)
	// The restarted worker runs on to the storm's end, so the flush at exit
	// is of a full queue.
	args = append(args, filepath.Join(wd, "examples/bench/plugins/worker.py"), strconv.FormatFloat(c.failAfter.Seconds(), 'f', 3, 64), "3")
	cmd := exec.CommandContext(ctx, agent, args...)
	cmd.Env = append(os.Environ(), "BENCH_OUT="+out)
	logs, err := cmd.CombinedOutput()
	if err != nil {
		return sample{}, "", fmt.Errorf("%v\n%s", err, logs)
	}
	exitNS, err1 := readNS(filepath.Join(out, "exit_ns"))
	startNS, err2 := readNS(filepath.Join(out, "start_ns"))
	m := failedRE.FindSubmatch(logs)
	if err1 != nil || err2 != nil || m == nil {
		return sample{}, "", fmt.Errorf("no exit, restart or 'worker failed' line (%v, %v)\n%s", err1, err2, logs)
	}
	failed, err := time.Parse(time.RFC3339Nano, string(m[1]))
	if err != nil {
		return sample{}, "", err
	}
	s := sample{detect: failed.Sub(time.Unix(0, exitNS)), recover: time.Duration(startNS - exitNS)}
	return s, string(summaryRE.Find(logs)), nil
}

func readNS(p string) (int64, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

func stats(v []time.Duration) (med, lo, hi time.Duration) {
	s := append([]time.Duration(nil), v...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	n := len(s)
	med = s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return med, s[0], s[n-1]
}

func report(c config, got map[string][]sample, summaries []string, posts int64) {
	pick := func(name string, f func(sample) time.Duration) []time.Duration {
		var v []time.Duration
		for _, s := range got[name] {
			v = append(v, f(s))
		}
		return v
	}
	fmt.Printf("\n%d runs each; storm: %d notifier events/s for %s, a webhook answering in %s, a detector taking 2s a check\n\n",
		c.runs, c.rate, c.storm, c.hookDelay)
	fmt.Println("| reaction to a worker exit | no plugins | event storm | ratio |")
	fmt.Println("|---|---|---|---|")
	for _, row := range []struct {
		name string
		f    func(sample) time.Duration
	}{{"exit → \"worker failed\" logged", func(s sample) time.Duration { return s.detect }},
		{"exit → restarted worker runs", func(s sample) time.Duration { return s.recover }}} {
		nm, nl, nh := stats(pick("none", row.f))
		sm, sl, sh := stats(pick("storm", row.f))
		fmt.Printf("| %s | %v (%v-%v) | %v (%v-%v) | %.2f |\n", row.name, ms(nm), ms(nl), ms(nh), ms(sm), ms(sl), ms(sh), float64(sm)/float64(nm))
	}
	fmt.Printf("\nwebhook posts received: %d in all\n", posts)
	for _, s := range summaries {
		fmt.Println("  " + s)
	}
}

func ms(d time.Duration) string { return d.Round(100 * time.Microsecond).String() }
