package main

import (
	"fmt"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"
)

// printTable prints the Markdown table of the medians over each
// configuration's runs, and what its columns mean.
func printTable(o options, keys []key, results map[key][]result) {
	if o.showMembers() {
		fmt.Printf("\n## Rendezvous at scale: an embedded etcd of %s members, N simulated agents (medians of %d runs)\n\n", orList(o.members), o.runs)
	} else {
		fmt.Printf("\n## Rendezvous at scale: one embedded etcd, N simulated agents (medians of %d runs)\n\n", o.runs)
	}
	fmt.Printf("Goal (issue): one round of 1024 agents in under %v. No torchrun baseline: its c10d rendezvous cannot run 1024 agents on one machine.\n", goal)
	fmt.Printf("Lease TTL %v, %d workers per agent; etcd in its own process (RSS and CPU are the server's alone); GOMAXPROCS %d.\n", o.ttl, o.nproc, runtime.GOMAXPROCS(0))
	if o.showMembers() {
		fmt.Println("A cluster's members run in that one process, on loopback, each client given every member's endpoint: its RSS and CPU are of all the members together, and they share this machine's cores with each other and with the agents.")
	}
	fmt.Printf("CPU probe: what %d busy threads got just before each run, in cores (on a shared VM it is below %d, and everything is slower for it).\n\n", runtime.GOMAXPROCS(0), runtime.GOMAXPROCS(0))
	fmt.Println("| N | clients | etcd members | runs ok | open | round | re-form | round ÷ 2 s goal | re-form ÷ 2 s goal | state value | etcd peak RSS | etcd CPU per run | CPU probe |")
	fmt.Println("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, kk := range keys {
		printRow(kk, results[kk])
	}
	fmt.Println()
	fmt.Println("open: N agents call rdzv.Open at once, until the last returns. round: all call Next at once, until the last returns (NNodesMin = NNodesMax = N).")
	fmt.Printf("re-form: %v after the round, one agent calls Fail(round); every agent calls Next again whenever its Round's Done() closes; until all hold a running round of one generation.\n", o.settle)
	fmt.Println("state value: the size of the state key once the round closed, which every watcher and reader of it receives each time it changes.")
}

// printRow prints one configuration's row: the medians over its good runs,
// or where its runs failed when none was good.
func printRow(kk key, all []result) {
	ok := okRuns(all)
	cores := make([]time.Duration, len(all))
	for i, r := range all {
		cores[i] = time.Duration(r.cores * 1000)
	}
	probe := fmt.Sprintf("%.2f", float64(median(cores))/1000)
	if len(ok) == 0 {
		printFailedRow(kk, all, probe)
		return
	}
	open, round, reform := medianOf(ok, func(r result) time.Duration { return r.open }), medianOf(ok, func(r result) time.Duration { return r.round }), medianOf(ok, func(r result) time.Duration { return r.reform })
	fmt.Printf("| %d | %d | %d | %d/%d | %v | %v | %v | %.2f | %.2f | %s | %s | %v | %s |\n", kk.n, kk.k, kk.m, len(ok), len(all),
		ms(open), ms(round), ms(reform), float64(round)/float64(goal), float64(reform)/float64(goal),
		kib(ok[0].stateBytes), mib(uint64(medianOf(ok, func(r result) time.Duration { return time.Duration(r.srvHWM) }))),
		ms(medianOf(ok, func(r result) time.Duration { return r.srvCPU })), probe)
}

// printFailedRow says where the runs failed; the open phase may still have
// a time.
func printFailedRow(kk key, all []result, probe string) {
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
	if d := medianOf(all, func(r result) time.Duration { return r.open }); d > 0 && cell("open") == "–" {
		open = ms(d).String()
	}
	fmt.Printf("| %d | %d | %d | 0/%d | %s | %s | %s | – | – | – | %s | %v | %s |\n", kk.n, kk.k, kk.m, len(all), open, cell("round"), cell("re-form"),
		mib(uint64(medianOf(all, func(r result) time.Duration { return time.Duration(r.srvHWM) }))), ms(medianOf(all, func(r result) time.Duration { return r.srvCPU })), probe)
}

// clusterGoal is the target for a cluster: a round and a re-form
// of 1024 agents against 3 members within this factor of those against 1.
const clusterGoal = 1.5

// printRatios prints, when more than one member count was measured, each
// larger one's median open, round and re-form times over the smallest
// one's (1 member, as a rule), per N and client count.
func printRatios(o options, keys []key, results map[key][]result) {
	if len(o.members) < 2 {
		return
	}
	base := slices.Min(o.members)
	fmt.Printf("\n### A cluster against %d member%s: ratios of the medians\n\n", base, plural(base))
	fmt.Printf("Goal (issue): against 3 members, a round and a re-form of 1024 agents within %.1f× of those against 1 member.\n\n", clusterGoal)
	fmt.Printf("| N | clients | ratio | open | round | re-form | round ≤ %.1f× | re-form ≤ %.1f× |\n", clusterGoal, clusterGoal)
	fmt.Println("|---:|---:|---|---:|---:|---:|---|---|")
	for _, kk := range keys {
		if kk.m == base {
			continue
		}
		cur, ref := okRuns(results[kk]), okRuns(results[key{kk.n, kk.k, base}])
		ratio := func(f func(result) time.Duration) (string, float64) {
			a, b := medianOf(cur, f), medianOf(ref, f)
			if len(cur) == 0 || len(ref) == 0 || a <= 0 || b <= 0 {
				return "–", 0
			}
			return fmt.Sprintf("%.2f", float64(a)/float64(b)), float64(a) / float64(b)
		}
		within := func(v float64) string {
			switch {
			case v == 0:
				return "–"
			case v <= clusterGoal:
				return "yes"
			}
			return "no"
		}
		open, _ := ratio(func(r result) time.Duration { return r.open })
		round, rv := ratio(func(r result) time.Duration { return r.round })
		reform, fv := ratio(func(r result) time.Duration { return r.reform })
		fmt.Printf("| %d | %d | %d members / %d | %s | %s | %s | %s | %s |\n", kk.n, kk.k, kk.m, base, open, round, reform, within(rv), within(fv))
	}
	fmt.Println()
	fmt.Println("Each ratio is of the medians over the runs that succeeded (– where a side has none). The member counts took turns run by run. The members share this machine's cores and talk over loopback; a real cluster has a host per member and a network between them.")
}

// okRuns are the runs that succeeded.
func okRuns(all []result) []result {
	var ok []result
	for _, r := range all {
		if r.ok {
			ok = append(ok, r)
		}
	}
	return ok
}

// orList writes counts as "1", "1 or 3", "1, 3 or 5".
func orList(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprint(x)
	}
	if len(s) == 1 {
		return s[0]
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// printFailures says where and why each failed run failed.
func printFailures(o options, keys []key, results map[key][]result) {
	for _, kk := range keys {
		for i, r := range results[kk] {
			if !r.ok {
				fmt.Printf("\n%s run %d failed: %s\n", kk.label(o.showMembers()), i+1, r.failed)
			}
		}
	}
}

// printWarnings lists the warnings and errors of every configuration's
// runs, most frequent first, with an example error each.
func printWarnings(o options, keys []key, results map[key][]result) {
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
		fmt.Printf("\n%s:\n", kk.label(o.showMembers()))
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

// printDetail prints -detail's tables of run number run of kk: per phase,
// the CPU and RSS, the agents' store requests and the server's counters
// (a cluster's are of all its members together, see scrape).
func printDetail(o options, kk key, r result, run int) {
	fmt.Printf("\n### Detail: %s, run %d\n\n", kk.label(o.showMembers()), run)
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
			who := "the etcd server's"
			if r.m > 1 {
				who = "the etcd members' (all together, one process: a write applied on each counts once per member)"
			}
			fmt.Printf("\n%s: %s counters (increase over the phase; watcher gauges at its end)\n\n", p.name, who)
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

// pct is the p-th percentile of sorted (nearest rank below).
func pct(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := (len(sorted) - 1) * p / 100
	return sorted[i]
}

// medianOf is the median of f over the runs, leaving out zeros (a phase
// the run did not get to); 0 if none.
func medianOf(rs []result, f func(result) time.Duration) time.Duration {
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

func median(v []time.Duration) time.Duration {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// ms rounds d for the tables: to 10 µs below 10 ms, else to 1 ms.
func ms(d time.Duration) time.Duration {
	if d < 10*time.Millisecond {
		return d.Round(10 * time.Microsecond)
	}
	return d.Round(time.Millisecond)
}

func mib(b uint64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
func kib(b int) string    { return fmt.Sprintf("%.1f KiB", float64(b)/1024) }
