package main

import (
	"fmt"
	"io"
	"slices"
	"time"
)

// report prints the per-scenario table and the summary figures.
func report(w io.Writer, rs []result, now time.Time) {
	fmt.Fprintf(w, "\nStraggler detection, %s; ddp-agent defaults (--straggler-cost 0.05).\n\n", now.UTC().Format("2006-01-02"))
	fmt.Fprintln(w, "| scenario | step | named | cause (injected) | steps to detection | seconds to detection | stall lines | false alarms |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
	var balancedHours float64
	falseAlarms, balancedAlarms, due, caught, causes, rightCauses := 0, 0, 0, 0, 0, 0
	var steps []int
	var secs []float64
	for _, r := range rs {
		named := "nobody"
		stepsCell, secsCell := "", ""
		if n, s, ok := r.detected(); ok {
			named = fmt.Sprintf("rank %d", r.s.rank)
			stepsCell, secsCell = fmt.Sprint(n), fmt.Sprintf("%.1f", s)
		} else if !r.s.balanced() {
			named = "not named"
		}
		causeCell := ""
		if c := r.cause(); c != "" {
			causeCell = fmt.Sprintf("%s (%s)", c, r.s.wantCause())
			causes++
			if c == r.s.wantCause() {
				rightCauses++
			}
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %d | %d |\n", r.s.name, r.stepTime().Round(time.Millisecond),
			named, causeCell, stepsCell, secsCell, r.stalls, r.falseAlarms())
		falseAlarms += r.falseAlarms()
		if r.s.balanced() {
			balancedHours += r.duration.Hours()
			balancedAlarms += r.falseAlarms()
		}
		if !r.s.balanced() && r.s.extraPct >= 10 {
			due++
			if n, s, ok := r.detected(); ok {
				caught++
				steps = append(steps, n)
				secs = append(secs, s)
			}
		}
	}
	fmt.Fprintln(w)
	if balancedHours > 0 {
		fmt.Fprintf(w, "- false alarms in balanced training: %d in %.1f minutes (%.1f per hour; goal 0)\n",
			balancedAlarms, balancedHours*60, float64(balancedAlarms)/balancedHours)
	}
	fmt.Fprintf(w, "- false alarms in all runs (a wrong rank named, or a stall in a balanced job): %d\n", falseAlarms)
	if due > 0 {
		fmt.Fprintf(w, "- detection at +10 %% and more: %d of %d (goal: all)\n", caught, due)
	}
	if len(steps) > 0 {
		slices.Sort(steps)
		slices.Sort(secs)
		fmt.Fprintf(w, "- steps to detection: median %d, max %d (goal <= 20); seconds: median %.1f, max %.1f (goal <= 30)\n",
			steps[len(steps)/2], steps[len(steps)-1], secs[len(secs)/2], secs[len(secs)-1])
	}
	if causes > 0 {
		fmt.Fprintf(w, "- cause accuracy: the cause injected named in %d of %d detections\n", rightCauses, causes)
	}
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
