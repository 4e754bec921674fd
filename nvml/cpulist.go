package nvml

import (
	"fmt"
	"math/bits"
	"slices"
	"strconv"
	"strings"
)

// CPUList is a set of CPU (or NUMA node) ids, sorted and without
// duplicates. Its text form, also its JSON form, is the kernel's list
// format, as in /sys/devices/system/node/node0/cpulist, taskset -c and
// nvidia-smi's "CPU Affinity" column: "0-15,32-47".
type CPUList []int

// String returns the list in the kernel's format, "" when empty.
func (l CPUList) String() string {
	var b strings.Builder
	for i := 0; i < len(l); {
		j := i
		for j+1 < len(l) && l[j+1] == l[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(l[i]))
		if j > i {
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(l[j]))
		}
		i = j + 1
	}
	return b.String()
}

// MarshalText implements encoding.TextMarshaler.
func (l CPUList) MarshalText() ([]byte, error) { return []byte(l.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler with ParseCPUList.
func (l *CPUList) UnmarshalText(text []byte) error {
	v, err := ParseCPUList(string(text))
	if err != nil {
		return err
	}
	*l = v
	return nil
}

// ParseCPUList reads a list in the kernel's format ("0-3,8,10-11"; blanks
// and a trailing newline are ignored; "" is the empty list). The result is
// sorted and without duplicates.
func ParseCPUList(s string) (CPUList, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return CPUList{}, nil
	}
	var l CPUList
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return nil, fmt.Errorf("cpu list %q: bad entry %q", s, part)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, fmt.Errorf("cpu list %q: bad range %q", s, part)
			}
		}
		if b-a > 1<<16 {
			return nil, fmt.Errorf("cpu list %q: range %q too large", s, part)
		}
		for c := a; c <= b; c++ {
			l = append(l, c)
		}
	}
	slices.Sort(l)
	return slices.Compact(l), nil
}

// maskToList turns NVML's bitmask words (64 ids per word on 64-bit hosts,
// as nvmlDeviceGetCpuAffinity and nvmlDeviceGetMemoryAffinity fill them)
// into a list.
func maskToList(words []uint) CPUList {
	l := CPUList{}
	for w, word := range words {
		for word != 0 {
			b := bits.TrailingZeros(word)
			l = append(l, w*bits.UintSize+b)
			word &^= 1 << b
		}
	}
	return l
}
