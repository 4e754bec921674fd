package relay

import (
	"context"
	"errors"
	"fmt"
	"net"
)

// BindHost is the IP address the leader's Server listens on for host, the
// address the agents use for the rendezvous (the round's master address):
// host itself when it is an IP address, else the address of this machine
// it resolves to (see pickBindIP). It never returns an unspecified
// address: the relay does not listen on every interface.
func BindHost(ctx context.Context, host string) (string, error) {
	if host == "" {
		return "", errors.New("relay: no address to bind: the round has no master address")
	}
	if ip := net.ParseIP(host); ip != nil {
		if ip.IsUnspecified() || ip.IsMulticast() {
			return "", fmt.Errorf("relay: bind %s: not the address of one host (the relay never listens on every interface)", host)
		}
		return ip.String(), nil
	}
	addrs, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil {
		return "", fmt.Errorf("relay: resolve %s to bind it: %w", host, err)
	}
	ifAddrs, err := net.InterfaceAddrs()
	if err != nil {
		return "", fmt.Errorf("relay: this machine's addresses, to bind %s: %w", host, err)
	}
	resolved := make([]net.IP, len(addrs))
	for i, a := range addrs {
		resolved[i] = a.IP
	}
	var local []net.IP
	for _, a := range ifAddrs {
		if n, ok := a.(*net.IPNet); ok {
			local = append(local, n.IP)
		}
	}
	ip, err := pickBindIP(host, resolved, local)
	if err != nil {
		return "", err
	}
	return ip.String(), nil
}

// pickBindIP chooses among the addresses host resolves to the one to
// bind: one of this machine's (local, or loopback, which Linux binds for
// all of 127/8), a non-loopback one first since other nodes cannot reach
// a loopback one (Debian maps the host name to 127.0.1.1 in /etc/hosts),
// IPv4 before IPv6, else in the resolver's order.
func pickBindIP(host string, resolved, local []net.IP) (net.IP, error) {
	isLocal := func(ip net.IP) bool {
		for _, l := range local {
			if l.Equal(ip) {
				return true
			}
		}
		return false
	}
	rank := func(ip net.IP) int { // lower is better; -1: not bindable
		switch {
		case ip.IsUnspecified() || ip.IsMulticast():
			return -1
		case ip.IsLoopback():
			return 2 + b2i(ip.To4() == nil)
		case isLocal(ip):
			return b2i(ip.To4() == nil)
		}
		return -1
	}
	var best net.IP
	bestRank := -1
	for _, ip := range resolved {
		if r := rank(ip); r >= 0 && (bestRank < 0 || r < bestRank) {
			best, bestRank = ip, r
		}
	}
	if best == nil {
		return nil, fmt.Errorf("relay: %s resolves to %v, none of them an address of this machine", host, resolved)
	}
	return best, nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
