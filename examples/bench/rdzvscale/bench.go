package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
)

// key is one configuration: N agents sharing K clients, against an etcd
// of M members.
type key struct{ n, k, m int }

// label names the configuration in the report: "N=16 clients=16", and
// " members=3" after it when members (more than one member count, or one
// other than 1, was asked for).
func (kk key) label(members bool) string {
	s := fmt.Sprintf("N=%d clients=%d", kk.n, kk.k)
	if members {
		s += fmt.Sprintf(" members=%d", kk.m)
	}
	return s
}

// showMembers says whether the report names the member count of each
// configuration: not when every run had the one embedded etcd.
func (o options) showMembers() bool { return len(o.members) > 1 || o.members[0] != 1 }

// configurations are the (N, K, M) triples of -n, -clients and -members,
// in order (M varying fastest), each once; K is capped at N.
func configurations(o options) []key {
	var keys []key
	for _, n := range o.ns {
		for _, c := range o.clients {
			k := n
			if c != "n" {
				k, _ = strconv.Atoi(c)
				k = min(k, n)
			}
			for _, m := range o.members {
				if !slices.Contains(keys, key{n, k, m}) {
					keys = append(keys, key{n, k, m})
				}
			}
		}
	}
	return keys
}

// bench runs every configuration -runs times and prints the report. The
// member counts of one N and client count take turns, run by run (run 1
// of each, then run 2 of each, ...), so that a slow spell of the machine
// hits them alike. It returns false when a run failed, or when ctx ended
// (then without a report).
func bench(ctx context.Context, o options) bool {
	keys := configurations(o)
	results := map[key][]result{}
	allOK := true
	for i := 0; i < len(keys); {
		j := i + 1 // keys[i:j]: the member counts of one N and K
		for j < len(keys) && keys[j].n == keys[i].n && keys[j].k == keys[i].k {
			j++
		}
		for run := 1; run <= o.runs; run++ {
			for _, kk := range keys[i:j] {
				if ctx.Err() != nil {
					fmt.Fprintln(os.Stderr, "rdzvscale: interrupted")
					return false
				}
				r := runOnce(ctx, o, kk, run)
				results[kk] = append(results[kk], r)
				allOK = allOK && r.ok
				logRun(o, kk, run, r)
			}
		}
		i = j
	}

	printTable(o, keys, results)
	printRatios(o, keys, results)
	printFailures(o, keys, results)
	printWarnings(o, keys, results)
	if o.detail {
		for _, kk := range keys {
			rs := results[kk]
			printDetail(o, kk, rs[len(rs)-1], len(rs))
		}
	}
	return allOK
}

// logRun prints one run's figures, or why it failed, to stderr as it ends.
func logRun(o options, kk key, run int, r result) {
	if r.ok {
		fmt.Fprintf(os.Stderr, "%s run %d/%d: open %v, round %v (first agent %v), re-form %v (first %v), etcd peak RSS %s, etcd CPU %v, CPU probe %.2f cores\n",
			kk.label(o.showMembers()), run, o.runs, ms(r.open), ms(r.round), ms(r.roundFirst), ms(r.reform), ms(r.reformFirst), mib(r.srvHWM), ms(r.srvCPU), r.cores)
		return
	}
	fmt.Fprintf(os.Stderr, "%s run %d/%d: FAILED (CPU probe %.2f cores): %s\n", kk.label(o.showMembers()), run, o.runs, r.cores, r.failed)
}
