package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestRead(t *testing.T) {
	stream := strings.Join([]string{
		`{"Action":"run","Package":"p","Test":"TestA"}`,
		`{"Action":"output","Package":"p","Test":"TestA","Output":"=== RUN   TestA\n"}`,
		`{"Action":"output","Package":"p","Test":"TestA","Output":"    e2e: over budget: TestA took 50s of its 30s\n"}`,
		`{"Action":"pass","Package":"p","Test":"TestA/sub","Elapsed":1}`,
		`{"Action":"pass","Package":"p","Test":"TestA","Elapsed":50.2}`,
		`{"Action":"output","Package":"p","Test":"TestB/x","Output":"    b_test.go:9: the reason\n"}`,
		`{"Action":"fail","Package":"p","Test":"TestB/x","Elapsed":3}`,
		`{"Action":"output","Package":"p","Test":"TestB","Output":"--- FAIL: TestB (3.00s)\n"}`,
		`{"Action":"fail","Package":"p","Test":"TestB","Elapsed":3}`,
		`{"Action":"pass","Package":"q","Test":"TestC","Elapsed":7}`,
		`# a build error line`,
		`{"Action":"fail","Package":"p","Elapsed":53.5}`,
		`{"Action":"pass","Package":"q","Elapsed":7.1}`,
	}, "\n")
	var out bytes.Buffer
	s, err := read(strings.NewReader(stream), &out)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s.passed, 2; got != want {
		t.Errorf("passed: got %d, want %d", got, want)
	}
	if got, want := s.failed, 2; got != want { // TestB and package p
		t.Errorf("failed: got %d, want %d", got, want)
	}
	if got, want := len(s.tests), 3; got != want {
		t.Errorf("tests: got %d, want %d (subtests are not counted)", got, want)
	}
	if got := slowest(s.tests, 1); len(got) != 1 || got[0].Test != "TestA" {
		t.Errorf("slowest: got %v, want TestA", got)
	}
	if got, want := strings.Join(s.over, ","), "TestA: 50s of its 30s"; got != want {
		t.Errorf("over budget: got %q, want %q", got, want)
	}
	for _, want := range []string{"=== RUN   TestA\n", "# a build error line\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	var rep bytes.Buffer
	printReport(&rep, s, 2)
	if !strings.Contains(rep.String(), "50.2s  p TestA (pass)") || !strings.Contains(rep.String(), "ran past their budget") {
		t.Errorf("report:\n%s", rep.String())
	}
	// The failure's reason ends the report, once, from the subtest.
	if !strings.HasSuffix(rep.String(), "== failed: p TestB/x (its last 1 lines of output)\n    b_test.go:9: the reason\n") {
		t.Errorf("the report does not end with the failure's reason:\n%s", rep.String())
	}
}
