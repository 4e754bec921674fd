package pluginhost

import (
	"reflect"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/plugins/detector"
	"github.com/ddp-agent/ddp-agent/plugins/notifier"
)

func TestChanged(t *testing.T) {
	base := detector.Finding{Subject: "eth0", Severity: detector.SeverityWarning, Action: detector.ActionWarn, Message: "flapping", Time: time.Unix(1, 0)}
	for _, tc := range []struct {
		name string
		prev *verdict
		f    func(detector.Finding) detector.Finding
		want bool
	}{
		{name: "no verdict before", prev: nil, f: func(f detector.Finding) detector.Finding { return f }, want: true},
		{name: "the same verdict later", prev: &verdict{f: base}, f: func(f detector.Finding) detector.Finding { f.Time = f.Time.Add(time.Hour); return f }, want: false},
		{name: "another severity", prev: &verdict{f: base}, f: func(f detector.Finding) detector.Finding { f.Severity = detector.SeverityError; return f }, want: true},
		{name: "another action", prev: &verdict{f: base}, f: func(f detector.Finding) detector.Finding { f.Action = detector.ActionDrainNode; return f }, want: true},
		{name: "another message", prev: &verdict{f: base}, f: func(f detector.Finding) detector.Finding { f.Message = "down"; return f }, want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := changed(tc.prev, tc.f(base)); got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// verdictHost is a host with one runner that has not started (so it
// queues every event), whose log the test reads.
func verdictHost(t *testing.T, onFinding func(Finding)) (*Host, *recorder, *runner) {
	rec := newRecorder()
	h := newTestHost(t, Config{OnFinding: onFinding, QueueSize: 64}, rec.logger())
	r := newRunner(h, Spec{Name: "sink"})
	h.runners = []*runner{r}
	return h, rec, r
}

// Which verdicts reach OnFinding, the log and the notifiers.
func TestVerdictRules(t *testing.T) {
	type verdictAt struct {
		plugin, subject string
		sev             detector.Severity
		act             detector.Action
		msg             string
		at              time.Duration
	}
	ok := func(at time.Duration) verdictAt {
		return verdictAt{"exec", "", detector.SeverityOK, detector.ActionNone, "fine", at}
	}
	warn := func(msg string, at time.Duration) verdictAt {
		return verdictAt{"exec", "", detector.SeverityWarning, detector.ActionWarn, msg, at}
	}
	restart := func(msg string, at time.Duration) verdictAt {
		return verdictAt{"exec", "", detector.SeverityError, detector.ActionRestartWorkers, msg, at}
	}
	for _, tc := range []struct {
		name     string
		verdicts []verdictAt
		acted    int      // OnFinding calls
		logged   []string // "LEVEL msg [changes_not_logged=N]"
		told     int      // events for the notifiers
	}{
		{name: "a first healthy verdict says nothing", verdicts: []verdictAt{ok(0), ok(time.Second)}},
		{name: "a warning is logged and told, not acted on", verdicts: []verdictAt{warn("slow", 0)},
			logged: []string{"WARN health finding"}, told: 1},
		{name: "an error is logged at ERROR and acted on", verdicts: []verdictAt{restart("down", 0)},
			acted: 1, logged: []string{"ERROR health finding"}, told: 1},
		{name: "the same verdict again is said once", verdicts: []verdictAt{warn("slow", 0), warn("slow", 2*time.Second), warn("slow", 4*time.Second)},
			logged: []string{"WARN health finding"}, told: 1},
		{name: "every restart verdict is acted on, repeated too", verdicts: []verdictAt{restart("down", 0), restart("down", time.Second), restart("down", 2*time.Second)},
			acted: 3, logged: []string{"ERROR health finding"}, told: 1},
		{name: "a drain verdict is acted on", verdicts: []verdictAt{{"exec", "", detector.SeverityError, detector.ActionDrainNode, "disk gone", 0}},
			acted: 1, logged: []string{"ERROR health finding"}, told: 1},
		{name: "a recovery is logged as cleared", verdicts: []verdictAt{warn("slow", 0), ok(2 * time.Second)},
			logged: []string{"WARN health finding", "INFO health finding cleared"}, told: 2},
		{name: "a new message within logEvery is told, not logged", verdicts: []verdictAt{warn("a", 0), warn("b", 500*time.Millisecond)},
			logged: []string{"WARN health finding"}, told: 2},
		{name: "the next line counts the changes not logged", verdicts: []verdictAt{warn("a", 0), warn("b", 500*time.Millisecond), warn("c", 600*time.Millisecond), warn("d", 1500*time.Millisecond)},
			logged: []string{"WARN health finding", "WARN health finding changes_not_logged=2"}, told: 4},
		{name: "a new severity after logFlap is logged", verdicts: []verdictAt{warn("slow", 0), restart("down", 200*time.Millisecond)},
			acted: 1, logged: []string{"WARN health finding", "ERROR health finding"}, told: 2},
		// A flap storm: the clearing 50 ms after the warning is told but not
		// logged, and counted into the line of the next change.
		{name: "a flap within logFlap is counted", verdicts: []verdictAt{warn("slow", 0), ok(50 * time.Millisecond), warn("slow", 2*time.Second)},
			logged: []string{"WARN health finding", "WARN health finding changes_not_logged=1"}, told: 3},
		{name: "subjects are apart", verdicts: []verdictAt{{"nic", "eth0", detector.SeverityWarning, detector.ActionWarn, "slow", 0}, {"nic", "eth1", detector.SeverityWarning, detector.ActionWarn, "slow", 0}},
			logged: []string{"WARN health finding", "WARN health finding"}, told: 2},
		{name: "plugins are apart", verdicts: []verdictAt{{"nic", "x", detector.SeverityWarning, detector.ActionWarn, "slow", 0}, {"disk", "x", detector.SeverityWarning, detector.ActionWarn, "slow", 0}},
			logged: []string{"WARN health finding", "WARN health finding"}, told: 2},
		{name: "no subject is the node", verdicts: []verdictAt{{"exec", "", detector.SeverityWarning, detector.ActionWarn, "slow", 0}, {"exec", "node", detector.SeverityWarning, detector.ActionWarn, "slow", 2 * time.Second}},
			logged: []string{"WARN health finding"}, told: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			acted := 0
			h, rec, r := verdictHost(t, func(Finding) { acted++ })
			t0 := time.Now()
			for _, v := range tc.verdicts {
				h.verdicts.add(v.plugin, detector.Finding{Subject: v.subject, Severity: v.sev, Action: v.act, Message: v.msg, Time: t0.Add(v.at)})
			}
			var logged []string
			for _, l := range rec.lines("") {
				s := l.String()
				if n, ok := l.attrs["changes_not_logged"]; ok {
					s += " changes_not_logged=" + n
				}
				logged = append(logged, s)
			}
			if acted != tc.acted {
				t.Errorf("OnFinding calls: got %v, want %v", acted, tc.acted)
			}
			if !reflect.DeepEqual(logged, tc.logged) {
				t.Errorf("logged: got %v, want %v", logged, tc.logged)
			}
			if got := len(r.q); got != tc.told {
				t.Errorf("told: got %v, want %v", got, tc.told)
			}
		})
	}
}

// What a verdict tells: the finding under its plugin and subject, at its
// time, the job's; OnFinding gets the plugin's name and the node subject.
func TestVerdictEvent(t *testing.T) {
	var acted []Finding
	h, rec, r := verdictHost(t, func(f Finding) { acted = append(acted, f) })
	h.cfg.Job, h.cfg.Node = "run-7", "node-3"
	at := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	h.verdicts.add("disk", detector.Finding{Severity: detector.SeverityError, Action: detector.ActionDrainNode, Message: "scratch full", Time: at})
	ev := <-r.q
	want := notifier.Event{Kind: notifier.HealthFinding, Time: at, Job: "run-7", Node: "node-3", Rank: -1, Message: "scratch full",
		Details: map[string]string{"plugin": "disk", "subject": "node", "severity": "error", "action": "drain-node"}}
	if !reflect.DeepEqual(ev, want) {
		t.Errorf("event: got %+v, want %+v", ev, want)
	}
	if len(acted) != 1 || acted[0].Plugin != "disk" || acted[0].Subject != "node" || !acted[0].Time.Equal(at) {
		t.Errorf("OnFinding: got %+v, want disk's finding about the node", acted)
	}
	if l := rec.lines("health finding"); len(l) != 1 || l[0].attrs["plugin"] != "disk" || l[0].attrs["action"] != "drain-node" || l[0].attrs["finding"] != "scratch full" {
		t.Errorf("log: got %v", l)
	}
	// A verdict without a time is stamped on arrival.
	before := time.Now()
	h.verdicts.add("disk", detector.Finding{Severity: detector.SeverityWarning, Message: "scratch 90%"})
	if ev := <-r.q; ev.Time.Before(before) {
		t.Errorf("a verdict without a time: event at %v, want at or after %v", ev.Time, before)
	}
}
