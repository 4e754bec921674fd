// Package opts parses the option values the bundled plugins share
// (durations, comma lists), so that each plugin's Configure refuses a bad
// value with the same words: the option's name, the value and why.
package opts

import (
	"fmt"
	"strings"
	"time"

	"github.com/ddp-agent/ddp-agent/plugins"
)

// Duration reads option name as a Go duration ("5s", "1m30s"), def when it
// is unset. It must be positive: a zero interval would spin and a zero
// timeout would fail every check.
func Duration(cfg plugins.Config, name, def string) (time.Duration, error) {
	v := cfg.Get(name, def)
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("option %s: %q is not a duration (like 5s, 500ms, 1m): %w", name, v, err)
	}
	if d <= 0 {
		return 0, fmt.Errorf("option %s: %q must be more than 0", name, v)
	}
	return d, nil
}

// List splits a comma list, trimming spaces and dropping empty items and
// repeats (first one kept), so "eth0, eth1,,eth0" is [eth0 eth1].
func List(v string) []string {
	var out []string
	seen := map[string]bool{}
	for _, s := range strings.Split(v, ",") {
		s = strings.TrimSpace(s)
		if s == "" || seen[s] {
			continue
		}
		seen[s] = true
		out = append(out, s)
	}
	return out
}
