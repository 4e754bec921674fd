package launch

import (
	"os"
	"regexp"
	"testing"
)

// TestFlagsDocumented: docs/launcher.md's flag table and the flags
// `ddp-agent run` takes are the same set, so that neither drifts from the
// other (issue 34 found a dozen stale details in the docs).
func TestFlagsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/launcher.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, row := range regexp.MustCompile("(?m)^\\| (`-.*?) \\|").FindAllStringSubmatch(string(doc), -1) {
		for _, m := range regexp.MustCompile("`(?:-\\w, )?--([a-z][a-z-]*)").FindAllStringSubmatch(row[1], -1) {
			documented[m[1]] = true
		}
	}
	if len(documented) < 20 {
		t.Fatalf("found %d flags in docs/launcher.md's table: has its layout changed?", len(documented))
	}
	for _, f := range flagSpecs {
		if !documented[f.name] {
			t.Errorf("--%s is not in docs/launcher.md's flag table", f.name)
		}
		delete(documented, f.name)
	}
	for name := range documented {
		t.Errorf("docs/launcher.md documents --%s, which ddp-agent run does not take", name)
	}
}
