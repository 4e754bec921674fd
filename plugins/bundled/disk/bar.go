package disk

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// bar is a floor on free space or free inodes: an amount, or a percent
// of the file system's total. The zero bar checks nothing.
type bar struct {
	amount  uint64
	percent float64 // used when > 0
	text    string  // as the user wrote it, for messages
}

// need is the least free amount the bar accepts on a file system of
// total: a percent is rounded up, so 5% of 4 MiB asks for 209716 bytes.
func (b bar) need(total uint64) uint64 {
	if b.percent > 0 {
		return uint64(math.Ceil(float64(total) * b.percent / 100))
	}
	return b.amount
}

// sizeUnits are the suffixes a size takes, case aside: SI ones are powers
// of 1000, IEC ones (KiB) powers of 1024, as df -H and df -h print them.
var sizeUnits = []struct {
	suffix string
	mult   float64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40},
	{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12},
	{"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}, {"t", 1 << 40},
	{"b", 1},
}

// parseBar reads "5%", "0", "1GiB", "500MB", "2.5G" or a bare number.
// Units are taken only for sizes (sized); an inode floor is a count.
func parseBar(s string, sized bool) (bar, error) {
	t := strings.TrimSpace(s)
	if p, ok := strings.CutSuffix(t, "%"); ok {
		f, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
		if err != nil || f < 0 || f >= 100 || math.IsNaN(f) {
			return bar{}, fmt.Errorf("%q is not a percent from 0 to under 100", s)
		}
		return bar{percent: f, text: t}, nil
	}
	num, mult := t, 1.0
	if sized {
		low := strings.ToLower(t)
		for _, u := range sizeUnits {
			if strings.HasSuffix(low, u.suffix) {
				num, mult = strings.TrimSpace(t[:len(t)-len(u.suffix)]), u.mult
				break
			}
		}
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || f < 0 || math.IsNaN(f) || math.IsInf(f, 0) || f*mult >= math.MaxUint64/2 {
		if sized {
			return bar{}, fmt.Errorf("%q is not a size (1GiB, 500MB, bytes when bare) nor a percent (5%%)", s)
		}
		return bar{}, fmt.Errorf("%q is not a count nor a percent (1%%)", s)
	}
	return bar{amount: uint64(math.Ceil(f * mult)), text: t}, nil
}

// formatBytes writes a size as df -h does, in powers of 1024.
func formatBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}
