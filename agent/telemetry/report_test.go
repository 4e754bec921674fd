package telemetry

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

func encode(t *testing.T, r Report) string {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestReportLimit(t *testing.T) {
	now := time.Date(2025, 3, 14, 10, 17, 13, 0, time.UTC)
	many := func(n int, f func(int) string) []string {
		var out []string
		for i := range n {
			out = append(out, f(i))
		}
		return out
	}
	for _, tc := range []struct {
		name string
		in   Report
		want Report
		err  string
	}{
		{name: "empty", want: Report{Updated: now, Stalls: []string{}, Stragglers: []ReportedStraggler{}}},
		{
			name: "first lines only, blank lines dropped",
			in:   Report{Updated: now.Add(-time.Minute), Stalls: []string{"a\nb", "  ", "\n", " c \r\n"}, Hang: "h1\r\nh2"},
			want: Report{Updated: now.Add(-time.Minute), Stalls: []string{"a", "c"}, Stragglers: []ReportedStraggler{}, Hang: "h1"},
		},
		{
			name: "the newest lines stay",
			in:   Report{Stalls: many(25, func(i int) string { return fmt.Sprint(i) })},
			want: Report{Updated: now, Stalls: many(10, func(i int) string { return fmt.Sprint(15 + i) }), Stragglers: []ReportedStraggler{}},
		},
		{
			name: "long lines are cut",
			in:   Report{Stalls: []string{strings.Repeat("x", 500), strings.Repeat("x", 501), strings.Repeat("x", 498) + "é"}, Hang: strings.Repeat("€", 200)},
			want: Report{Updated: now, Stalls: []string{strings.Repeat("x", 500), strings.Repeat("x", 497) + "…", strings.Repeat("x", 498) + "é"},
				Stragglers: []ReportedStraggler{}, Hang: strings.Repeat("€", 165) + "…"},
		},
		{
			name: "invalid UTF-8 counts as JSON stores it",
			in:   Report{Stalls: []string{"a\xffb", strings.Repeat("\xff", 200)}},
			want: Report{Updated: now, Stalls: []string{"a\uFFFDb", "\uFFFD"}, Stragglers: []ReportedStraggler{}},
		},
		{
			name: "stragglers capped, names cut",
			in: Report{Stragglers: append([]ReportedStraggler{{Rank: 0, Host: strings.Repeat("h", 300), GPU: "GPU-0\nx", Last: 0, Steps: 0}},
				slices.Repeat([]ReportedStraggler{{Rank: 1, Last: 1, Steps: 2}}, 12)...)},
			want: Report{Updated: now, Stalls: []string{}, Stragglers: append([]ReportedStraggler{{Rank: 0, Host: strings.Repeat("h", 253) + "…", GPU: "GPU-0"}},
				slices.Repeat([]ReportedStraggler{{Rank: 1, Last: 1, Steps: 2}}, 9)...)},
		},
		{name: "negative rank", in: Report{Stragglers: []ReportedStraggler{{Rank: -1}}}, err: "straggler rank -1: last in 0 of 0 steps"},
		{name: "negative count", in: Report{Stragglers: []ReportedStraggler{{Rank: 1, Last: -1, Steps: 2}}}, err: "straggler rank 1: last in -1 of 2 steps"},
		{name: "negative late", in: Report{Stragglers: []ReportedStraggler{{Rank: 1, Last: 1, Steps: 2, LateMS: -1}}}, err: "straggler rank 1: late -1 ms, share 0 of step time"},
		{name: "share above 1", in: Report{Stragglers: []ReportedStraggler{{Rank: 1, Last: 1, Steps: 2, Share: 1.5}}}, err: "straggler rank 1: late 0 ms, share 1.5 of step time"},
		{
			name: "a bad straggler past the cap",
			in:   Report{Stragglers: append(slices.Repeat([]ReportedStraggler{{Rank: 1, Last: 1, Steps: 2}}, 10), ReportedStraggler{Rank: 2, Last: 3, Steps: 2})},
			err:  "straggler rank 2: last in 3 of 2 steps",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.in.limit(now)
			if tc.err != "" {
				if err == nil || err.Error() != tc.err {
					t.Fatalf("got error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if encode(t, got) != encode(t, tc.want) {
				t.Fatalf("got %s, want %s", encode(t, got), encode(t, tc.want))
			}
			for _, l := range append(slices.Clone(got.Stalls), got.Hang) {
				if len(l) > MaxStallLineBytes {
					t.Fatalf("a line of %d bytes", len(l))
				}
			}
		})
	}
}

// TestReportEncode: the stored form is the one `ddp-agent status` has
// always read (its field names are an interface), and decodes back.
func TestReportEncode(t *testing.T) {
	now := time.Date(2025, 3, 14, 10, 17, 13, 0, time.UTC)
	for _, tc := range []struct {
		name string
		in   Report
		want string
	}{
		{name: "empty", want: `{"updated":"2025-03-14T10:17:13Z","stalls":[],"stragglers":[]}`},
		{
			name: "full",
			in: Report{Stalls: []string{"step 1 bucket 0: rank 3 late"}, Hang: "step 2 hung\nstacks",
				Stragglers: []ReportedStraggler{{Rank: 3, Host: "host-b", GPU: "GPU-1", Last: 15, Steps: 20, LateMS: 212, Share: 0.104, Cause: "gpu", Evidence: "throttled"}}},
			want: `{"updated":"2025-03-14T10:17:13Z","stalls":["step 1 bucket 0: rank 3 late"],"stragglers":[{"rank":3,"host":"host-b","gpu":"GPU-1","last":15,"steps":20,"late_ms":212,"share":0.104,"cause":"gpu","evidence":"throttled"}],"hang":"step 2 hung"}`,
		},
		{
			name: "no cause yet",
			in:   Report{Stragglers: []ReportedStraggler{{Rank: 1, Last: 1, Steps: 2}}},
			want: `{"updated":"2025-03-14T10:17:13Z","stalls":[],"stragglers":[{"rank":1,"host":"","gpu":"","last":1,"steps":2}]}`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := tc.in.Encode(now)
			if err != nil {
				t.Fatal(err)
			}
			if got := string(b); got != tc.want {
				t.Fatalf("got %s, want %s", got, tc.want)
			}
			back, err := DecodeReport(b)
			if err != nil {
				t.Fatal(err)
			}
			if got := encode(t, back); got != tc.want {
				t.Errorf("decoded back: got %s, want %s", got, tc.want)
			}
		})
	}
	if _, err := DecodeReport([]byte(`{"stalls": 5}`)); err == nil || !strings.HasPrefix(err.Error(), "decode stalls report: ") {
		t.Errorf("got %v, want a decode error", err)
	}
	if _, err := (Report{Stragglers: []ReportedStraggler{{Rank: 1, Last: 3, Steps: 2}}}).Encode(now); err == nil {
		t.Errorf("a straggler last in 3 of 2 steps: got no error")
	}
}

// TestReportedStraggler: a straggler crosses the store in one shape: what
// a report keeps of it comes back as it was named.
func TestReportedStraggler(t *testing.T) {
	for _, tc := range []struct {
		name string
		st   Straggler
		w    Worker
		want ReportedStraggler
		back Straggler // what a reader gets: no p-value, noise or phases
	}{
		{
			name: "named with a cause",
			st: Straggler{Rank: 5, Last: 15, Steps: 20, Significant: 18, Late: 212 * time.Millisecond, StepTime: 2 * time.Second, Noise: time.Millisecond,
				Share: 0.104, P: 1e-6, Compute: 200 * time.Millisecond, Phased: 10, Cause: CauseGPU, Evidence: "throttled"},
			w:    Worker{Rank: 5, Host: "vm3", GPU: "GPU-5c1e", GPUIndex: 1},
			want: ReportedStraggler{Rank: 5, Host: "vm3", GPU: "GPU-5c1e", Last: 15, Steps: 20, LateMS: 212, Share: 0.104, Cause: "gpu", Evidence: "throttled"},
			back: Straggler{Rank: 5, Last: 15, Steps: 20, Late: 212 * time.Millisecond, Share: 0.104, Cause: CauseGPU, Evidence: "throttled"},
		},
		{
			name: "sub-millisecond wait, no GPU",
			st:   Straggler{Rank: 0, Last: 3, Steps: 40, Late: 1500 * time.Microsecond},
			w:    Worker{Rank: 0, GPUIndex: -1},
			want: ReportedStraggler{Rank: 0, Last: 3, Steps: 40, LateMS: 1.5},
			back: Straggler{Rank: 0, Last: 3, Steps: 40, Late: 1500 * time.Microsecond},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ReportStraggler(tc.st, tc.w)
			if got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			if back := got.Straggler(); back != tc.back {
				t.Errorf("back: got %+v, want %+v", back, tc.back)
			}
			r := Report{Stragglers: []ReportedStraggler{got}}
			if named := r.Named(); len(named) != 1 || named[0] != tc.back {
				t.Errorf("Named: got %+v, want [%+v]", named, tc.back)
			}
		})
	}
}
