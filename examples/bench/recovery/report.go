package main

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
)

// report prints the Markdown tables of every launcher's runs: recovery and
// start-up, the ratio, where the time goes, and the notes.
func report(w io.Writer, c config, kinds []launcherKind, res map[string][]result, broken map[string]error) {
	reportRecovery(w, c, kinds, res)
	reportBreakdown(w, kinds, res)
	reportNotes(w, c, kinds, broken)
}

// reportRecovery prints the recovery table (median, min, max; runs that did
// not recover count as longer than any) and the ratio of the medians.
func reportRecovery(w io.Writer, c config, kinds []launcherKind, res map[string][]result) {
	fmt.Fprintf(w, "\n## Recovery after losing 1 of %d nodes\n\n", c.nodes)
	fmt.Fprintf(w, "%d launcher processes on loopback, --nnodes %d:%d, %d gloo worker(s) each (all_reduce every 50 ms), "+
		"c10d rendezvous; one launcher that does not host the store is SIGKILLed with its workers. "+
		"Recovery: kill to every one of the %d surviving ranks running user code (init_process_group returned) in a world of %d. "+
		"Start-up: first launch to the full world of %d running user code.\n\n",
		c.nodes, c.minNodes, c.nodes, c.nproc, (c.nodes-1)*c.nproc, (c.nodes-1)*c.nproc, c.nodes*c.nproc)
	fmt.Fprintln(w, "| launcher | median recovery | min | max | runs recovered | median start-up |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	med := map[string]time.Duration{}
	for _, k := range kinds {
		rs := res[k.name]
		if len(rs) == 0 {
			fmt.Fprintf(w, "| %s | no run measured | | | 0/%d | |\n", k.name, c.runs)
			continue
		}
		var rec, su []time.Duration
		okRuns := 0
		for _, r := range rs {
			su = append(su, r.startup)
			if r.ok() {
				okRuns++
				rec = append(rec, r.recovery)
			} else {
				rec = append(rec, -1) // sorts as +inf
			}
		}
		sortInf(rec)
		m := rec[len(rec)/2]
		med[k.name] = m
		fmt.Fprintf(w, "| %s | %s | %s | %s | %d/%d | %s |\n", k.name, fmtInf(m, c.timeout), fmtInf(rec[0], c.timeout),
			fmtInf(rec[len(rec)-1], c.timeout), okRuns, len(rs), fmtDur(median(su)))
	}
	if a, t := med["ddp-agent"], med["torchrun"]; a > 0 && t > 0 {
		fmt.Fprintf(w, "\nRatio ddp-agent / torchrun, median recovery: %.3f (%.1fx faster)\n", float64(a)/float64(t), float64(t)/float64(a))
	}
}

// reportBreakdown prints the medians of each phase, from the kill, over the
// runs where the phase was seen.
func reportBreakdown(w io.Writer, kinds []launcherKind, res map[string][]result) {
	fmt.Fprintf(w, "\nWhere the time goes (medians over the runs, from the kill):\n\n")
	fmt.Fprintln(w, "| launcher | a survivor's collective failed | a launcher noticed | dead node dropped | last call began | round complete | rendezvous done (last survivor) | new workers started (last) | world re-formed |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|")
	for _, k := range kinds {
		rs := res[k.name]
		if len(rs) == 0 {
			fmt.Fprintf(w, "| %s | no run measured | | | | | | | |\n", k.name)
			continue
		}
		col := func(f func(result) time.Duration) string {
			var ds []time.Duration
			for _, r := range rs {
				if d := f(r); d >= 0 {
					ds = append(ds, d)
				}
			}
			if len(ds) == 0 {
				return "-"
			}
			return "+" + fmtDur(median(ds))
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", k.name,
			col(func(r result) time.Duration { return r.collFailed }),
			col(func(r result) time.Duration { return r.noticed }),
			col(func(r result) time.Duration { return r.dropped }),
			col(func(r result) time.Duration { return r.lastCall }),
			col(func(r result) time.Duration { return r.complete }),
			col(func(r result) time.Duration { return r.rdzvDone }),
			col(func(r result) time.Duration { return r.spawned }),
			col(func(r result) time.Duration {
				if r.ok() {
					return r.recovery
				}
				return -1
			}))
	}
}

// reportNotes prints torchrun's settings, and which launchers had a run that
// could not be measured.
func reportNotes(w io.Writer, c config, kinds []launcherKind, broken map[string]error) {
	for _, k := range kinds {
		if k.name == "torchrun" {
			fmt.Fprintf(w, "\ntorchrun runs with its defaults (PyTorch 1.13): --monitor_interval 5 s; c10d keep-alive every 5 s, "+
				"a node is dead after 3 missed (15 s); last_call_timeout 30 s, join_timeout 600 s, close_timeout 30 s, "+
				"store read_timeout 60 s (torch/distributed/elastic/rendezvous/dynamic_rendezvous.py, "+
				"c10d_rendezvous_backend.py; torch/distributed/run.py). LOGLEVEL=%s only makes its log show the phases; "+
				"\"dead node dropped\", \"last call began\" and \"round complete\" come from rdzv_probe.py, which reads the rendezvous state every 50 ms.\n",
				orNone(c.torchrunLogLevel))
		}
	}
	for _, k := range kinds {
		if err := broken[k.name]; err != nil {
			fmt.Fprintf(w, "\n%s: a run could not be measured, its remaining runs were skipped: %v\n", k.name, firstLine(err.Error()))
		}
	}
}

func orNone(s string) string {
	if s == "" {
		return "(unset)"
	}
	return s
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i] + " (see above)"
	}
	return s
}

func sortInf(ds []time.Duration) {
	sort.Slice(ds, func(i, j int) bool {
		a, b := ds[i], ds[j]
		if a < 0 {
			return false
		}
		if b < 0 {
			return true
		}
		return a < b
	})
}

func fmtInf(d, timeout time.Duration) string {
	if d < 0 {
		return "> " + timeout.String()
	}
	return fmtDur(d)
}

func median(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}
