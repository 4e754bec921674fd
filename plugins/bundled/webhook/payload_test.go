package webhook

import (
	"strings"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/plugins/notifier"
)

func TestSummary(t *testing.T) {
	long := strings.Repeat("é", 250)
	for _, tc := range []struct {
		ev   notifier.Event
		want string
	}{
		{notifier.Event{Kind: notifier.WorkerFailed, Job: "j1", Node: "n1", Rank: 1, Message: "rank 1 exited 1: CUDA error\nTraceback (most recent call last):\n..."},
			":rotating_light: job j1 on node n1: worker_failed rank 1: rank 1 exited 1: CUDA error"},
		{notifier.Event{Kind: notifier.JobStarted, Job: "j1", Node: "n1", Rank: -1},
			":white_check_mark: job j1 on node n1: job_started"},
		{notifier.Event{Kind: notifier.Straggler, Job: "j", Node: "n", Rank: 0, Message: "\n\n  rank 0 is 30% slower  \n"},
			":warning: job j on node n: straggler rank 0: rank 0 is 30% slower"},
		{notifier.Event{Kind: "something_new", Job: "j", Node: "n", Rank: -1, Message: "x"},
			":information_source: job j on node n: something_new: x"},
		{notifier.Event{Kind: notifier.Hang, Job: "j", Node: "n", Rank: -1, Message: long},
			":rotating_light: job j on node n: hang: " + strings.Repeat("é", maxTextLine) + "…"},
	} {
		if got := summary(tc.ev); got != tc.want {
			t.Errorf("summary(%+v)\n got %q\nwant %q", tc.ev, got, tc.want)
		}
	}
}

// A detector's finding reads as bad as it is, says whose it is and on
// what, and a cleared one says so, as the agent's host sends them.
func TestSummaryOfAFinding(t *testing.T) {
	finding := func(sev, act, msg string) notifier.Event {
		return notifier.Event{Kind: notifier.HealthFinding, Job: "j", Node: "n", Rank: -1, Message: msg,
			Details: map[string]string{"plugin": "nic", "subject": "eth0", "severity": sev, "action": act}}
	}
	for _, tc := range []struct {
		name string
		ev   notifier.Event
		want string
	}{
		{"a drain", finding("error", "drain-node", "link down"),
			":rotating_light: job j on node n: health_finding nic on eth0 error, drain-node: link down"},
		{"a restart", finding("error", "restart-workers", "link flapped"),
			":rotating_light: job j on node n: health_finding nic on eth0 error, restart-workers: link flapped"},
		{"an error that asks nothing", finding("error", "none", "CRC errors"),
			":rotating_light: job j on node n: health_finding nic on eth0 error: CRC errors"},
		{"a warning", finding("warning", "warn", "slow link"),
			":warning: job j on node n: health_finding nic on eth0 warning, warn: slow link"},
		{"cleared", finding("ok", "none", "fine"),
			":white_check_mark: job j on node n: health_finding nic on eth0 cleared: fine"},
		{"without details", notifier.Event{Kind: notifier.HealthFinding, Job: "j", Node: "n", Rank: -1, Message: "x"},
			":warning: job j on node n: health_finding: x"},
	} {
		if got := summary(tc.ev); got != tc.want {
			t.Errorf("%s:\n got %q\nwant %q", tc.name, got, tc.want)
		}
	}
}

func TestNewPayload(t *testing.T) {
	now := time.Date(2026, 11, 26, 3, 4, 5, 6, time.UTC)
	at := time.Date(2026, 11, 26, 4, 4, 5, 123456789, time.FixedZone("CET", 3600))
	p := newPayload(notifier.Event{Kind: notifier.NodeLost, Time: at, Rank: -1}, now)
	if p.Time != "2026-11-26T03:04:05.123456789Z" || p.Rank != nil || p.Details == nil || p.Schema != schemaName {
		t.Errorf("payload %+v: want UTC time, no rank, empty details", p)
	}
	p = newPayload(notifier.Event{Kind: notifier.NodeLost, Rank: 0}, now)
	if p.Time != "2026-11-26T03:04:05.000000006Z" || p.Rank == nil || *p.Rank != 0 {
		t.Errorf("payload %+v: want now's time and rank 0", p)
	}
}
