package nic

import (
	"fmt"
	"strings"

	"github.com/ddp-agent/ddp-agent/plugins/detector"
)

// judge turns one look at a port into its verdict, given the look before
// (nil on the first) and the min-rate option (0: no check). A port down
// is an error that drains the node: the job's collectives over it stall
// until NCCL's timeout, and a restart on this node would stall again. A
// port that flapped, or runs slow, still carries the job: a warning.
func judge(p port, prev *portState, cur portState, minRate int64) detector.Finding {
	f := detector.Finding{Subject: p.Name}
	switch {
	case !cur.Present:
		return bad(f, detector.SeverityError, detector.ActionDrainNode, "%s is gone (no longer in sysfs): a port the job uses is lost", p)
	case cur.Err != nil:
		return bad(f, detector.SeverityWarning, detector.ActionWarn, "cannot read the state of %s: %v", p, cur.Err)
	case !cur.Up:
		return bad(f, detector.SeverityError, detector.ActionDrainNode, "%s is down (%s): a port down on an interface the job uses drains the node", p, cur.State)
	}
	var warns []string
	if n := flaps(p, prev, cur); n > 0 {
		what := "carrier changes"
		if p.IB {
			what = "link downs"
		}
		warns = append(warns, fmt.Sprintf("%s flapped: %d %s since the last check", p, n, what))
	}
	if minRate > 0 && cur.RateMbps > 0 && cur.RateMbps < minRate {
		warns = append(warns, fmt.Sprintf("%s runs at %d Mb/s, below min-rate %d Mb/s", p, cur.RateMbps, minRate))
	}
	if len(warns) > 0 {
		return bad(f, detector.SeverityWarning, detector.ActionWarn, "%s", strings.Join(warns, "; "))
	}
	f.Message = fmt.Sprintf("%s up (%s)", p, cur.State)
	if cur.RateMbps > 0 {
		f.Message = fmt.Sprintf("%s up at %d Mb/s (%s)", p, cur.RateMbps, cur.State)
	}
	return f
}

func bad(f detector.Finding, s detector.Severity, a detector.Action, format string, args ...any) detector.Finding {
	f.Severity, f.Action, f.Message = s, a, fmt.Sprintf(format, args...)
	return f
}

// flaps counts the transitions of an up port's link since the look
// before that the looks themselves did not see. carrier_changes counts
// every down and every up, so a port seen down and now up owes it one;
// link_downed counts downs only, so any growth is a flap. A counter that
// went back (a driver reload) or is unknown counts nothing.
func flaps(p port, prev *portState, cur portState) int64 {
	if prev == nil || !prev.Present || prev.Err != nil || prev.Changes < 0 || cur.Changes < 0 {
		return 0
	}
	n := cur.Changes - prev.Changes
	if !p.IB && !prev.Up {
		n-- // the up the looks saw
	}
	return max(n, 0)
}
