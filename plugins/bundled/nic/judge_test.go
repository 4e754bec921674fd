package nic

import (
	"errors"
	"strings"
	"testing"

	"github.com/ddp-agent/ddp-agent/plugins/detector"
)

func TestJudge(t *testing.T) {
	eth, ib := netPort("eth0"), ibPort("mlx5_0", "1")
	up := func(changes, rate int64) portState {
		return portState{Present: true, Up: true, State: "operstate up, carrier", Changes: changes, RateMbps: rate}
	}
	down := func(changes int64) portState {
		return portState{Present: true, State: "operstate down, no carrier", Changes: changes, RateMbps: -1}
	}
	ptr := func(s portState) *portState { return &s }
	for _, tc := range []struct {
		name    string
		p       port
		prev    *portState
		cur     portState
		minRate int64
		sev     detector.Severity
		act     detector.Action
		msg     string
	}{
		{"healthy first look", eth, nil, up(4, 10000), 0, detector.SeverityOK, detector.ActionNone, "eth0 up at 10000 Mb/s"},
		{"healthy, rate unknown", eth, ptr(up(4, -1)), up(4, -1), 100, detector.SeverityOK, detector.ActionNone, "eth0 up (operstate up, carrier)"},
		{"down", eth, ptr(up(4, 10000)), down(5), 0, detector.SeverityError, detector.ActionDrainNode, "eth0 is down (operstate down, no carrier)"},
		{"no carrier, down from the first look", eth, nil, down(1), 0, detector.SeverityError, detector.ActionDrainNode, "drains the node"},
		{"gone", eth, ptr(up(4, 10000)), portState{Changes: -1, RateMbps: -1}, 0, detector.SeverityError, detector.ActionDrainNode, "eth0 is gone"},
		{"unreadable", eth, nil, portState{Present: true, Err: errors.New("hung: no answer within 2s"), Changes: -1}, 0, detector.SeverityWarning, detector.ActionWarn, "cannot read the state of eth0: hung"},
		{"flapped between looks", eth, ptr(up(4, 10000)), up(6, 10000), 0, detector.SeverityWarning, detector.ActionWarn, "eth0 flapped: 2 carrier changes since the last check"},
		{"seen down, now up: a recovery, no flap", eth, ptr(down(5)), up(6, 10000), 0, detector.SeverityOK, detector.ActionNone, "eth0 up"},
		{"seen down, now up, flapped on the way", eth, ptr(down(5)), up(8, 10000), 0, detector.SeverityWarning, detector.ActionWarn, "2 carrier changes"},
		{"counter went back (driver reload)", eth, ptr(up(40, 10000)), up(2, 10000), 0, detector.SeverityOK, detector.ActionNone, "eth0 up"},
		{"counter unknown", eth, ptr(up(-1, 10000)), up(3, 10000), 0, detector.SeverityOK, detector.ActionNone, "eth0 up"},
		{"slow", eth, nil, up(4, 1000), 10000, detector.SeverityWarning, detector.ActionWarn, "eth0 runs at 1000 Mb/s, below min-rate 10000 Mb/s"},
		{"fast enough", eth, nil, up(4, 10000), 10000, detector.SeverityOK, detector.ActionNone, "eth0 up"},
		{"slow and flapping: both said", eth, ptr(up(4, 1000)), up(6, 1000), 10000, detector.SeverityWarning, detector.ActionWarn, "flapped: 2 carrier changes since the last check; eth0 runs at 1000"},
		{"IB link downed while up", ib, ptr(up(0, 100000)), up(1, 100000), 0, detector.SeverityWarning, detector.ActionWarn, "mlx5_0/1 flapped: 1 link downs"},
		{"IB seen down, now up", ib, ptr(down(1)), up(1, 100000), 0, detector.SeverityOK, detector.ActionNone, "mlx5_0/1 up at 100000 Mb/s"},
		{"IB down", ib, nil, portState{Present: true, State: "state 1: DOWN, phys_state 3: Disabled", Changes: 0}, 0, detector.SeverityError, detector.ActionDrainNode, "mlx5_0/1 is down (state 1: DOWN"},
	} {
		f := judge(tc.p, tc.prev, tc.cur, tc.minRate)
		if f.Subject != tc.p.Name || f.Severity != tc.sev || f.Action != tc.act || !strings.Contains(f.Message, tc.msg) {
			t.Errorf("%s: got %s/%s %s %q; want %s/%s %s containing %q", tc.name, f.Severity, f.Action, f.Subject, f.Message, tc.sev, tc.act, tc.p.Name, tc.msg)
		}
	}
}

func TestUpAndRate(t *testing.T) {
	for _, tc := range []struct {
		oper    string
		carrier bool
		want    bool
	}{
		{"up", true, true}, {"unknown", true, true}, {"up", false, false},
		{"down", false, false}, {"lowerlayerdown", false, false}, {"dormant", true, false},
	} {
		if got := netUp(tc.oper, tc.carrier); got != tc.want {
			t.Errorf("netUp(%q, %v) = %v, want %v", tc.oper, tc.carrier, got, tc.want)
		}
	}
	for _, tc := range []struct {
		state, phys string
		want        bool
	}{
		{"4: ACTIVE", "5: LinkUp", true}, {"ACTIVE", "LinkUp", true},
		{"2: INIT", "5: LinkUp", false}, {"3: ARMED", "5: LinkUp", false},
		{"1: DOWN", "3: Disabled", false}, {"4: ACTIVE", "7: Phy Test", false},
	} {
		if got := ibUp(tc.state, tc.phys); got != tc.want {
			t.Errorf("ibUp(%q, %q) = %v, want %v", tc.state, tc.phys, got, tc.want)
		}
	}
	for in, want := range map[string]int64{
		"100 Gb/sec (4X EDR)": 100000, "2.5 Gb/sec (1X SDR)": 2500, "400 Gb/sec (4X NDR)": 400000,
		"": -1, "fast": -1, "100 Mb/sec": -1, "0 Gb/sec": -1,
	} {
		if got := parseIBRate(in); got != want {
			t.Errorf("parseIBRate(%q) = %d, want %d", in, got, want)
		}
	}
}

func TestDefaultPorts(t *testing.T) {
	upSt := portState{Present: true, Up: true}
	downSt := portState{Present: true}
	c := func(p port, device bool, st portState) candidate {
		return candidate{port: p, device: device, state: st}
	}
	for _, tc := range []struct {
		name  string
		cands []candidate
		want  string
	}{
		{"host: device-backed only, never lo", []candidate{
			c(netPort("lo"), false, upSt), c(netPort("eno1"), true, upSt), c(netPort("eno2"), true, downSt),
			c(netPort("docker0"), false, upSt), c(netPort("veth12ab"), false, upSt),
		}, "eno1"},
		{"container: its veth", []candidate{c(netPort("lo"), false, upSt), c(netPort("eth0"), false, upSt)}, "eth0"},
		{"IB ports ACTIVE beside", []candidate{
			c(netPort("eth0"), true, upSt), c(ibPort("mlx5_0", "1"), true, upSt), c(ibPort("mlx5_1", "1"), true, downSt),
		}, "eth0 mlx5_0/1"},
		{"container with IB", []candidate{c(netPort("eth0"), false, upSt), c(ibPort("mlx5_0", "1"), true, upSt)}, "eth0 mlx5_0/1"},
		{"nothing up", []candidate{c(netPort("lo"), false, upSt), c(netPort("eth0"), true, downSt)}, ""},
	} {
		var names []string
		for _, p := range defaultPorts(tc.cands) {
			names = append(names, p.Name)
		}
		if got := strings.Join(names, " "); got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
	}
}
