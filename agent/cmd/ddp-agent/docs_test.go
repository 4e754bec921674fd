package main

import (
	"bytes"
	"os"
	"regexp"
	"testing"
)

// TestSidecarFlagsDocumented: docs/sidecar.md's flag table and the flags
// `ddp-agent sidecar` takes (its -h) are the same set.
func TestSidecarFlagsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/sidecar.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `--([a-z][a-z-]*)").FindAllStringSubmatch(string(doc), -1) {
		documented[m[1]] = true
	}
	var help bytes.Buffer
	_, _, _ = sidecarFlags([]string{"-h"}, func(string) string { return "" }, &help)
	taken := regexp.MustCompile(`(?m)^  -([a-z][a-z-]*)`).FindAllStringSubmatch(help.String(), -1)
	if len(taken) < 5 {
		t.Fatalf("found %d flags in the sidecar's -h:\n%s", len(taken), help.String())
	}
	for _, m := range taken {
		if !documented[m[1]] {
			t.Errorf("--%s is not in docs/sidecar.md's flag table", m[1])
		}
		delete(documented, m[1])
	}
	for name := range documented {
		t.Errorf("docs/sidecar.md documents --%s, which ddp-agent sidecar does not take", name)
	}
}
