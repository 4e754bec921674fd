package main

import (
	"fmt"
	"sort"
	"time"
)

// median is the middle of xs (the upper one of an even count).
func median[T int | float64 | time.Duration](xs []T) T {
	s := append([]T(nil), xs...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// report prints the Markdown table of the medians, with the ratios of the
// first launcher to each other one.
func report(launchers []launcher, res map[string][]result, runs, nproc int) {
	get := func(name string) (su, rs time.Duration, rss int, cpu float64) {
		var a, b []time.Duration
		var c []int
		var d []float64
		for _, r := range res[name] {
			a, b, c, d = append(a, r.startup), append(b, r.restart), append(c, r.rssKiB), append(d, r.cpuPercent)
		}
		return median(a), median(b), median(c), median(d)
	}
	fmt.Printf("\nMedians of %d runs, %d idle workers, launchers interleaved; ratio = ddp-agent / that launcher.\n\n", runs, nproc)
	fmt.Println("| launcher | start-up | restart latency | launcher RSS | launcher CPU (idle) |")
	fmt.Println("|---|---|---|---|---|")
	aSU, aRS, aRSS, _ := get(launchers[0].name)
	for _, l := range launchers {
		su, rs, rss, cpu := get(l.name)
		if l.name == launchers[0].name {
			fmt.Printf("| %s | %v | %v | %.1f MiB | %.2f %% |\n", l.name, su.Round(time.Millisecond), rs.Round(time.Millisecond), float64(rss)/1024, cpu)
			continue
		}
		fmt.Printf("| %s | %v (ratio %.3f) | %v (ratio %.3f) | %.1f MiB (ratio %.2f) | %.2f %% |\n", l.name,
			su.Round(time.Millisecond), float64(aSU)/float64(su), rs.Round(time.Millisecond), float64(aRS)/float64(rs),
			float64(rss)/1024, float64(aRSS)/float64(rss), cpu)
	}
}
