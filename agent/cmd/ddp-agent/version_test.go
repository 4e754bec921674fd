package main

import (
	"runtime"
	"testing"
)

func TestVersionLine(t *testing.T) {
	goBuild := runtime.Version() + ", " + runtime.GOOS + "/" + runtime.GOARCH
	for _, c := range []struct{ version, commit, want string }{
		{"0.1.0", "48cc464", "ddp-agent 0.1.0 (48cc464, " + goBuild + ")"},
		{"0.1.0", "48cc464-dirty", "ddp-agent 0.1.0 (48cc464-dirty, " + goBuild + ")"},
		{"0.1.0", "", "ddp-agent 0.1.0 (" + goBuild + ")"},
		{"dev", "", "ddp-agent dev (" + goBuild + ")"}, // go build without the Makefile
		{"v0.2.0", "v0.2.0", "ddp-agent v0.2.0 (" + goBuild + ")"},
	} {
		if got := versionLine(c.version, c.commit); got != c.want {
			t.Errorf("versionLine(%q, %q) = %q, want %q", c.version, c.commit, got, c.want)
		}
	}
}
