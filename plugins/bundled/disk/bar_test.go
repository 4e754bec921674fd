package disk

import (
	"strings"
	"testing"
)

func TestParseBar(t *testing.T) {
	for _, tc := range []struct {
		in    string
		sized bool
		total uint64 // need(total) is checked against want
		want  uint64
		err   string
	}{
		{"5%", true, 4 << 20, 209716, ""}, // rounded up
		{"1%", false, 64, 1, ""},
		{"0.5 %", false, 1000, 5, ""},
		{"0", true, 1 << 30, 0, ""},
		{"0%", true, 1 << 30, 0, ""},
		{"1GiB", true, 0, 1 << 30, ""},
		{"1gib", true, 0, 1 << 30, ""},
		{"500MB", true, 0, 500e6, ""},
		{"2.5G", true, 0, 5 << 29, ""},
		{"10 KiB", true, 0, 10240, ""},
		{"4096", true, 0, 4096, ""},
		{"12B", true, 0, 12, ""},
		{"1000", false, 0, 1000, ""},
		{"1k", false, 0, 0, `"1k" is not a count nor a percent`},
		{"100%", true, 0, 0, "not a percent from 0 to under 100"},
		{"-1%", true, 0, 0, "not a percent"},
		{"-5GiB", true, 0, 0, `"-5GiB" is not a size`},
		{"lots", true, 0, 0, "is not a size"},
		{"1PiB", true, 0, 0, "is not a size"},
		{"", true, 0, 0, "is not a size"},
	} {
		b, err := parseBar(tc.in, tc.sized)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("parseBar(%q, %v) = %+v, %v; want error %q", tc.in, tc.sized, b, err, tc.err)
			}
			continue
		}
		if err != nil || b.need(tc.total) != tc.want {
			t.Errorf("parseBar(%q, %v).need(%d) = %d, %v; want %d", tc.in, tc.sized, tc.total, b.need(tc.total), err, tc.want)
		}
	}
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[uint64]string{
		0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 128 << 10: "128.0 KiB",
		3<<30 + 1<<29: "3.5 GiB", 2 << 40: "2.0 TiB", 3 << 50: "3.0 PiB",
	} {
		if got := formatBytes(n); got != want {
			t.Errorf("formatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
