package webhook

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ddp-agent/ddp-agent/plugins/detector"
	"github.com/ddp-agent/ddp-agent/plugins/notifier"
)

// schemaName names the body's layout. Fields may be added under the same
// name; one renamed, removed or changed in meaning makes a new one.
const schemaName = "ddp-agent.event/v1"

// payload is the body of each POST, the documented schema
// (docs/plugins-bundled.md). Every field is always there but rank.
type payload struct {
	Schema     string            `json:"schema"`
	Kind       string            `json:"kind"`
	Time       string            `json:"time"` // RFC 3339, nanoseconds, UTC
	Job        string            `json:"job"`
	Node       string            `json:"node"`
	Generation uint64            `json:"generation"`
	Attempt    int               `json:"attempt"`
	Rank       *int              `json:"rank,omitempty"` // none when the event concerns no rank
	Message    string            `json:"message"`
	Details    map[string]string `json:"details"` // {} when none
	Text       string            `json:"text"`    // one line for a chat: what a Slack-style incoming webhook shows
}

// newPayload lays out ev; an event without a time is stamped now.
func newPayload(ev notifier.Event, now time.Time) payload {
	t := ev.Time
	if t.IsZero() {
		t = now
	}
	p := payload{
		Schema: schemaName, Kind: string(ev.Kind), Time: t.UTC().Format(time.RFC3339Nano),
		Job: ev.Job, Node: ev.Node, Generation: ev.Generation, Attempt: ev.Attempt,
		Message: ev.Message, Details: ev.Details, Text: summary(ev),
	}
	if ev.Rank >= 0 {
		r := ev.Rank
		p.Rank = &r
	}
	if p.Details == nil {
		p.Details = map[string]string{}
	}
	return p
}

func encodePayload(ev notifier.Event, now time.Time) ([]byte, error) {
	return json.Marshal(newPayload(ev, now))
}

// maxTextLine bounds the message's line in text: a chat line, not a
// root-cause report (that is in message).
const maxTextLine = 200

// summary is the event in one chat line:
// ":rotating_light: job J on node N: worker_failed rank 1: <message's first line>";
// a detector's finding says whose it is and what it asks, or that it
// cleared: ":white_check_mark: job J on node N: health_finding disk on /data cleared: <message>".
func summary(ev notifier.Event) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s job %s on node %s: %s", icon(ev), ev.Job, ev.Node, ev.Kind)
	if ev.Rank >= 0 {
		fmt.Fprintf(&b, " rank %d", ev.Rank)
	}
	if ev.Kind == notifier.HealthFinding {
		b.WriteString(findingVerdict(ev.Details))
	}
	if line := firstLine(ev.Message, maxTextLine); line != "" {
		b.WriteString(": " + line)
	}
	return b.String()
}

// icon is a chat emoji for how bad the event is: a job in trouble, one to
// look at, or good news.
func icon(ev notifier.Event) string {
	switch ev.Kind {
	case notifier.WorkerFailed, notifier.GPUFault, notifier.Hang, notifier.NodeLost, notifier.PluginFailed, notifier.JobFailed:
		return ":rotating_light:"
	case notifier.Restarted, notifier.Straggler:
		return ":warning:"
	case notifier.HealthFinding:
		return findingIcon(ev.Details)
	case notifier.JobStarted, notifier.JobFinished, notifier.NodeJoined:
		return ":white_check_mark:"
	}
	return ":information_source:"
}

// findingIcon is a health_finding's emoji: by what it asks (a restart or
// a drain is trouble), else by its severity (ok: it cleared).
func findingIcon(d map[string]string) string {
	switch {
	case d["action"] == detector.ActionRestartWorkers.String(), d["action"] == detector.ActionDrainNode.String(),
		d["severity"] == detector.SeverityError.String():
		return ":rotating_light:"
	case d["severity"] == detector.SeverityOK.String():
		return ":white_check_mark:"
	}
	return ":warning:"
}

// findingVerdict is a health_finding's words after its kind: whose
// finding, on what, and "cleared" or its severity and action:
// " disk on /data cleared", " nic on eth0 error, drain-node".
func findingVerdict(d map[string]string) string {
	var b strings.Builder
	if d["plugin"] != "" {
		b.WriteString(" " + d["plugin"])
	}
	if d["subject"] != "" {
		b.WriteString(" on " + d["subject"])
	}
	switch sev, act := d["severity"], d["action"]; {
	case sev == detector.SeverityOK.String():
		b.WriteString(" cleared")
	case sev != "" && act != "" && act != detector.ActionNone.String():
		b.WriteString(" " + sev + ", " + act)
	case sev != "":
		b.WriteString(" " + sev)
	}
	return b.String()
}

// firstLine is s's first non-blank line, cut to max runes with "…".
func firstLine(s string, max int) string {
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l == "" {
			continue
		}
		if utf8.RuneCountInString(l) > max {
			l = string([]rune(l)[:max]) + "…"
		}
		return l
	}
	return ""
}
