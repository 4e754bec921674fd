package pluginhost

import (
	"fmt"
	"log/slog"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/ddp-agent/ddp-agent/plugins/detector"
	"github.com/ddp-agent/ddp-agent/plugins/notifier"
)

// logEvery: one subject's changing findings are logged at most once in
// this long; the lines between are counted into the next one.
const logEvery = time.Second

// logFlap: a subject whose severity changes faster than this (a storm of
// flaps) is logged at most this often.
const logFlap = 100 * time.Millisecond

// verdicts turns detector verdicts into what the agent does: every
// verdict that asks for a restart or a drain goes to OnFinding; a change
// of a subject's verdict is logged and told to the notifiers (a subject
// that recovers too), so a check that says the same every 30 s says it
// once.
type verdicts struct {
	h        *Host
	mu       sync.Mutex
	last     map[string]*verdict // by plugin and subject
	subjects map[string]int      // by plugin: its subjects in last
	full     map[string]bool     // by plugin: said it has too many subjects
}

type verdict struct {
	f          detector.Finding
	logged     time.Time
	suppressed int
}

func newVerdicts(h *Host) *verdicts {
	return &verdicts{h: h, last: map[string]*verdict{}, subjects: map[string]int{}, full: map[string]bool{}}
}

// roomFor counts a new subject of plugin, or says (once) that it has too
// many; a restart or drain it asks for is acted on all the same. v.mu is
// held.
func (v *verdicts) roomFor(plugin string) bool {
	if v.subjects[plugin] < maxSubjects {
		v.subjects[plugin]++
		return true
	}
	if !v.full[plugin] {
		v.full[plugin] = true
		v.h.log.Warn("plugin reports on too many subjects; the verdicts of new ones are not logged", "plugin", plugin, "max_subjects", maxSubjects)
	}
	return false
}

// changed is whether f says something else of its subject than prev.
func changed(prev *verdict, f detector.Finding) bool {
	return prev == nil || prev.f.Severity != f.Severity || prev.f.Action != f.Action || prev.f.Message != f.Message
}

// A finding's message and subject are cut to these many bytes, and a
// plugin's verdicts are kept for at most maxSubjects subjects: a 3 MiB
// message logged once a second wrote 60 MB of log in 20 s, and each new
// subject is a line and an entry kept for the agent's life.
const (
	maxFindingMessage = 1024
	maxFindingSubject = 128
	maxSubjects       = 64
)

// clip cuts s to n bytes (on a rune boundary), saying how much it cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s... (%d bytes cut)", s[:cut], len(s)-cut)
}

func (v *verdicts) add(plugin string, f detector.Finding) {
	if f.Time.IsZero() {
		f.Time = time.Now()
	}
	if f.Subject == "" {
		f.Subject = "node"
	}
	f.Message, f.Subject = clip(f.Message, maxFindingMessage), clip(f.Subject, maxFindingSubject)
	if f.Action >= detector.ActionRestartWorkers {
		v.h.cfg.OnFinding(Finding{Plugin: plugin, Finding: f})
	}
	key := plugin + "\x00" + f.Subject
	v.mu.Lock()
	prev := v.last[key]
	if !changed(prev, f) {
		v.mu.Unlock()
		return
	}
	if prev == nil && !v.roomFor(plugin) {
		v.mu.Unlock()
		return
	}
	recovered := prev != nil && prev.f.Severity != detector.SeverityOK && f.Severity == detector.SeverityOK
	cur := &verdict{f: f}
	if prev != nil {
		cur.logged, cur.suppressed = prev.logged, prev.suppressed
	}
	v.last[key] = cur
	quiet := f.Severity == detector.SeverityOK && !recovered // the first healthy verdict: nothing to say
	// A change of severity (a warning, an error, a clearing) is logged
	// unless it comes within logFlap of the last line; a new message at the
	// same severity at most once per logEvery.
	since := f.Time.Sub(cur.logged)
	newSeverity := prev == nil || prev.f.Severity != f.Severity
	logIt := !quiet && (since >= logEvery || newSeverity && since >= logFlap)
	suppressed := cur.suppressed
	switch {
	case logIt:
		cur.logged, cur.suppressed = f.Time, 0
	case !quiet:
		cur.suppressed++
	}
	v.mu.Unlock()
	if quiet {
		return
	}
	if logIt {
		level, msg := slog.LevelWarn, "health finding"
		switch {
		case recovered:
			level, msg = slog.LevelInfo, "health finding cleared"
		case f.Severity >= detector.SeverityError:
			level = slog.LevelError
		}
		attrs := []any{"plugin", plugin, "subject", f.Subject, "severity", f.Severity.String(), "action", f.Action.String(), "finding", f.Message}
		if suppressed > 0 {
			attrs = append(attrs, "changes_not_logged", suppressed)
		}
		v.h.log.Log(v.h.ctx, level, msg, attrs...)
	}
	v.h.Notify(notifier.Event{Kind: notifier.HealthFinding, Time: f.Time, Rank: -1, Message: f.Message,
		Details: map[string]string{"plugin": plugin, "subject": f.Subject, "severity": f.Severity.String(), "action": f.Action.String()}})
}
