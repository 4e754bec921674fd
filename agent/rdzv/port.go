package rdzv

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// freePort picks a port for the workers' store (MASTER_PORT) on addr. The
// worker binds it seconds later, and a port the kernel handed out (bind to
// :0) is from the ephemeral range, which every outgoing connection on the
// host draws from meanwhile: a busy node then fails the whole job with
// EADDRINUSE. So it tries random ports below the ephemeral range first,
// which only explicit binds use, and falls back to the kernel's choice.
func freePort(addr string) (int, error) {
	lo := ephemeralLow()
	const floor = 10000
	if lo-floor > 1000 {
		for range 50 {
			p := floor + rand.IntN(lo-floor)
			if l, err := net.Listen("tcp", net.JoinHostPort(addr, strconv.Itoa(p))); err == nil {
				l.Close()
				return p, nil
			}
		}
	}
	l, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		return 0, fmt.Errorf("pick a free master port on %s: %w", addr, err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ephemeralLow is the first port of the kernel's ephemeral range.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				return n
			}
		}
	}
	return 32768 // Linux's default
}
