package main

import (
	"fmt"
	"strings"
	"time"
)

// result of one run. Durations of phases are from the kill; -1 when unknown.
type result struct {
	startup   time.Duration // first launch to the full world running user code
	recovery  time.Duration // kill to the survivors' world running user code
	timedOut  bool          // recovery did not happen within -timeout
	failed    string        // recovery failed for another reason (the survivors gave up)
	storeHost int           // launcher index hosting the rendezvous store
	victim    int           // launcher index killed
	victimGR  int           // its GROUP_RANK in the full world
	// Phases, from the kill: a survivor's collective failed, a surviving
	// launcher noticed, the last surviving launcher finished its rendezvous,
	// the last replacement worker started.
	collFailed, noticed, rdzvDone, spawned time.Duration
	// From the torchrun rendezvous probe: the dead node dropped (its
	// keep-alive expired: the next round opens), the last call began (min
	// nodes joined), the round completed; and the last call's length.
	dropped, lastCall, complete, lastCallLen time.Duration
	keptDir                                  string
}

func (r result) ok() bool { return !r.timedOut && r.failed == "" }

func (r result) describe() string {
	var b strings.Builder
	switch {
	case r.timedOut:
		fmt.Fprintf(&b, "recovery > timeout")
	case r.failed != "":
		fmt.Fprintf(&b, "recovery FAILED (%s)", r.failed)
	default:
		fmt.Fprintf(&b, "recovery %v", r.recovery.Round(time.Millisecond))
	}
	fmt.Fprintf(&b, ", startup %v; killed launcher %d (group rank %d), store host launcher %d",
		r.startup.Round(time.Millisecond), r.victim, r.victimGR, r.storeHost)
	fmt.Fprintf(&b, "; after the kill: collective failed %s, launcher noticed %s, dead node dropped %s",
		phase(r.collFailed), phase(r.noticed), phase(r.dropped))
	if r.lastCall >= 0 || r.complete >= 0 {
		fmt.Fprintf(&b, ", last call began %s (%s long), round complete %s",
			phase(r.lastCall), phaseLen(r.lastCallLen), phase(r.complete))
	}
	fmt.Fprintf(&b, ", rendezvous done %s, new workers started %s", phase(r.rdzvDone), phase(r.spawned))
	if r.keptDir != "" {
		fmt.Fprintf(&b, "; logs in %s", r.keptDir)
	}
	return b.String()
}

func phase(d time.Duration) string {
	if d < 0 {
		return "-"
	}
	return "+" + fmtDur(d)
}

func phaseLen(d time.Duration) string {
	if d < 0 {
		return "?"
	}
	return fmtDur(d)
}

func fmtDur(d time.Duration) string {
	switch {
	case d >= 10*time.Second:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d >= time.Second:
		return fmt.Sprintf("%.2fs", d.Seconds())
	default:
		return fmt.Sprintf("%dms", d.Milliseconds())
	}
}
