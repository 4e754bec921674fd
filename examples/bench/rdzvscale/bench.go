package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
)

// key is one configuration: N agents sharing K clients.
type key struct{ n, k int }

// configurations are the (N, K) pairs of -n and -clients, in order, each
// once; K is capped at N.
func configurations(o options) []key {
	var keys []key
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
	return keys
}

// bench runs every configuration -runs times and prints the report. It
// returns false when a run failed, or when ctx ended (then without a
// report).
func bench(ctx context.Context, o options) bool {
	keys := configurations(o)
	results := map[key][]result{}
	allOK := true
	for _, kk := range keys {
		for run := 1; run <= o.runs; run++ {
			if ctx.Err() != nil {
				fmt.Fprintln(os.Stderr, "rdzvscale: interrupted")
				return false
			}
			r := runOnce(ctx, o, kk.n, kk.k, run)
			results[kk] = append(results[kk], r)
			allOK = allOK && r.ok
			logRun(o, kk, run, r)
		}
	}

	printTable(o, keys, results)
	printFailures(keys, results)
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

// logRun prints one run's figures, or why it failed, to stderr as it ends.
func logRun(o options, kk key, run int, r result) {
	if r.ok {
		fmt.Fprintf(os.Stderr, "N=%d clients=%d run %d/%d: open %v, round %v (first agent %v), re-form %v (first %v), etcd peak RSS %s, etcd CPU %v, CPU probe %.2f cores\n",
			kk.n, kk.k, run, o.runs, ms(r.open), ms(r.round), ms(r.roundFirst), ms(r.reform), ms(r.reformFirst), mib(r.srvHWM), ms(r.srvCPU), r.cores)
		return
	}
	fmt.Fprintf(os.Stderr, "N=%d clients=%d run %d/%d: FAILED (CPU probe %.2f cores): %s\n", kk.n, kk.k, run, o.runs, r.cores, r.failed)
}
