package supervisor

import (
	"os"
	"testing"
)

func TestRenderPrefix(t *testing.T) {
	host, _ := os.Hostname()
	id := Worker{LocalRank: 1, Rank: 5}
	for tmpl, want := range map[string]string{
		"":                             "[rank5]:",
		"[${role_name}${local_rank}]:": "[trainer1]:",
		"${hostname}:${rank}: ":        host + ":5: ",
		"plain ":                       "plain ",
		"${unknown}":                   "${unknown}",
	} {
		if got := RenderPrefix(tmpl, "trainer", id); got != want {
			t.Errorf("RenderPrefix(%q): got %q, want %q", tmpl, got, want)
		}
	}
}
