package comm

import (
	"path/filepath"
	"reflect"
	"testing"

	"github.com/ddp-agent/ddp-agent/shim/status"
	"github.com/ddp-agent/ddp-agent/wire"
)

// TestParseReformed: the hook's JSON becomes the message, milliseconds
// microseconds; what is not a report is refused as invalid.
func TestParseReformed(t *testing.T) {
	m, err := ParseReformed(`{"reform": 2, "step": 12, "resume": 11, "source": 1, "error": "RuntimeError: boom",
		"phases": [{"name": "abort", "ms": 0.25}, {"name": "rendezvous", "ms": 40}]}`)
	if err != nil {
		t.Fatal(err)
	}
	want := wire.Reformed{Reform: 2, Step: 12, Resume: 11, Source: 1, Error: "RuntimeError: boom",
		Phases: []wire.Phase{{Name: "abort", Micros: 250}, {Name: "rendezvous", Micros: 40_000}}}
	if !reflect.DeepEqual(m, want) {
		t.Fatalf("got %+v, want %+v", m, want)
	}
	for _, bad := range []string{`not json`, `{"phases": [{"name": "", "ms": 1}]}`, `{"phases": [{"name": "x", "ms": -1}]}`} {
		if _, err := ParseReformed(bad); status.Of(err) != status.Invalid {
			t.Errorf("ParseReformed(%q) = %v, want an invalid-argument error", bad, err)
		}
	}
}

// TestReformedToSidecar: a communicator under a sidecar tells it of a
// re-formation; one with no agent and no sidecar has no one to tell.
func TestReformedToSidecar(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "sc")
	sc := &fakeSidecar{}
	serveSidecar(t, dir, sc)
	c := openWithSidecar(t, filepath.Join(dir, "sidecar.sock"))
	eventually(t, "the sidecar link", func() bool { on, _ := sidecarInfo(t, c); return on })
	m := wire.Reformed{Reform: 1, Step: 5, Resume: 5, Error: "ValueError: x", Phases: []wire.Phase{{Name: "abort", Micros: 9}}}
	if err := c.Reformed(m); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the report at the sidecar", func() bool {
		sc.mu.Lock()
		defer sc.mu.Unlock()
		return len(sc.reformed) == 1 && reflect.DeepEqual(sc.reformed[0], m)
	})

	alone, err := ParseConfig(`{"rank": 0, "world_size": 1, "bootstrap": "external", "timeout_ms": 10000}`)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := Open(alone)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if err := c2.Reformed(m); err != nil {
		t.Errorf("without an agent: %v, want nothing to do", err)
	}
}
