// Command testtime runs `go test -json ...` (or reads its output on its
// standard input), prints the test output as go test itself would (the
// events' Output), and ends with the slowest tests and packages and the
// tests that ran past the budget they state, so the day the suite grows is
// the day it shows. It exits non-zero when go test did, or when the stream
// reports a failure or holds no test.
//
//	go run ./scripts/testtime [-top 15] [-o times.json] -- go test -json ./...
//	go test -json ./... | go run ./scripts/testtime
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

// timing is one finished test or package.
type timing struct {
	Package string  `json:"package"`
	Test    string  `json:"test,omitempty"`
	Seconds float64 `json:"seconds"`
	Result  string  `json:"result"`
}

// overBudget matches what an end-to-end test logs when it ran past its
// budget (agent/e2e's budget helper).
var overBudget = regexp.MustCompile(`over budget: (\S+) took (\S+) of its (\S+)`)

// failure is the output of one failed test, the lines a reader of a
// CI log's tail needs and that scrolled away above the report.
type failure struct {
	name  string // package and test
	lines []string
}

// keepLines bounds what a failure keeps: its last lines say why.
const keepLines = 80

// summary is what the stream said.
type summary struct {
	tests, packages []timing
	over            []string
	failed, passed  int
	failures        []failure
}

// read copies the events' output to out and gathers the timings.
func read(in io.Reader, out io.Writer) (summary, error) {
	var s summary
	running := map[string][]string{} // a test's output until it ends
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			fmt.Fprintf(out, "%s\n", line) // build errors and the like come as plain text
			continue
		}
		key := e.Package + " " + e.Test
		if e.Output != "" {
			io.WriteString(out, e.Output)
			if e.Test != "" {
				running[key] = append(running[key], e.Output)
			}
			if m := overBudget.FindStringSubmatch(e.Output); m != nil {
				s.over = append(s.over, fmt.Sprintf("%s: %s of its %s", m[1], m[2], m[3]))
			}
		}
		switch e.Action {
		case "pass", "fail", "skip":
			if e.Action == "fail" && e.Test != "" {
				lines := running[key]
				if len(lines) > keepLines {
					lines = lines[len(lines)-keepLines:]
				}
				s.failures = append(s.failures, failure{name: key, lines: lines})
			}
			delete(running, key)
			if e.Action == "skip" {
				continue
			}
			t := timing{Package: e.Package, Test: e.Test, Seconds: e.Elapsed, Result: e.Action}
			if e.Test == "" {
				s.packages = append(s.packages, t)
				if e.Action == "fail" {
					s.failed++
				}
				continue
			}
			if !strings.Contains(e.Test, "/") { // subtests count within their parent
				s.tests = append(s.tests, t)
				if e.Action == "pass" {
					s.passed++
				} else {
					s.failed++
				}
			}
		}
	}
	return s, sc.Err()
}

// slowest returns the n longest timings, longest first.
func slowest(ts []timing, n int) []timing {
	out := append([]timing(nil), ts...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Seconds > out[j].Seconds })
	if len(out) > n {
		out = out[:n]
	}
	return out
}

func printReport(w io.Writer, s summary, top int) {
	fmt.Fprintf(w, "\n== the %d slowest tests\n", top)
	for _, t := range slowest(s.tests, top) {
		fmt.Fprintf(w, "%8.1fs  %s %s (%s)\n", t.Seconds, t.Package, t.Test, t.Result)
	}
	fmt.Fprintf(w, "== the %d slowest packages\n", top)
	var total float64
	for _, p := range s.packages {
		total += p.Seconds
	}
	for _, p := range slowest(s.packages, top) {
		fmt.Fprintf(w, "%8.1fs  %s (%s)\n", p.Seconds, p.Package, p.Result)
	}
	fmt.Fprintf(w, "== %d packages, %.0f s of package time; %d tests passed, %d failed\n",
		len(s.packages), total, s.passed, s.failed)
	if len(s.over) > 0 {
		fmt.Fprintf(w, "== %d tests ran past their budget:\n", len(s.over))
		for _, o := range s.over {
			fmt.Fprintf(w, "  %s\n", o)
		}
	}
	for _, f := range innermost(s.failures) {
		fmt.Fprintf(w, "== failed: %s (its last %d lines of output)\n", f.name, len(f.lines))
		for _, l := range f.lines {
			io.WriteString(w, l)
		}
	}
}

// innermost drops a failed test whose subtest failed too: the parent's
// own output is only the subtests' verdicts.
func innermost(fs []failure) []failure {
	var out []failure
	for _, f := range fs {
		parent := false
		for _, g := range fs {
			if strings.HasPrefix(g.name, f.name+"/") {
				parent = true
				break
			}
		}
		if !parent {
			out = append(out, f)
		}
	}
	return out
}

func main() {
	top := flag.Int("top", 15, "how many of the slowest tests and packages to list")
	out := flag.String("o", "", "also write every test's and package's time here, as JSON")
	flag.Parse()
	start := time.Now()
	in, wait := io.Reader(os.Stdin), func() error { return nil }
	if flag.NArg() > 0 { // run the command, its stdout and stderr into one stream
		cmd := exec.Command(flag.Arg(0), flag.Args()[1:]...)
		r, w, err := os.Pipe()
		if err != nil {
			fmt.Fprintln(os.Stderr, "testtime:", err)
			os.Exit(2)
		}
		cmd.Stdout, cmd.Stderr = w, w
		if err := cmd.Start(); err != nil {
			fmt.Fprintln(os.Stderr, "testtime:", err)
			os.Exit(2)
		}
		w.Close()
		in, wait = r, cmd.Wait
	}
	s, err := read(in, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testtime:", err)
		os.Exit(2)
	}
	code := 0
	var exit *exec.ExitError
	if err := wait(); errors.As(err, &exit) {
		code = exit.ExitCode()
	} else if err != nil {
		fmt.Fprintln(os.Stderr, "testtime:", err)
		code = 2
	}
	printReport(os.Stdout, s, *top)
	fmt.Printf("== read for %s\n", time.Since(start).Round(time.Second))
	if *out != "" {
		data, _ := json.MarshalIndent(map[string][]timing{"tests": s.tests, "packages": s.packages}, "", " ")
		err := os.MkdirAll(filepath.Dir(*out), 0o755) // .cache/ does not exist in a fresh clone
		if err == nil {
			err = os.WriteFile(*out, data, 0o644)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "testtime:", err)
			os.Exit(2)
		}
	}
	switch {
	case code != 0:
		os.Exit(code)
	case s.failed > 0 || s.passed == 0:
		os.Exit(1)
	}
}
