package host

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// PeerInfo is what one rank tells the others during bootstrap; the caller
// serializes it (for example as JSON).
type PeerInfo struct {
	Addr   string `json:"addr"`    // "host:port" the rank listens on
	HostID string `json:"host_id"` // the machine and its /dev/shm; equal HostIDs mean the same host
	Nonce  string `json:"nonce"`   // random hex, unique per endpoint: names it in the handshake and in shared memory
}

// Options configure Listen.
type Options struct {
	// Host is the address to advertise. "" means the local address that
	// routes to MasterAddr, or 127.0.0.1 when there is none.
	Host string
	// MasterAddr is "host" or "host:port" of the job's master.
	MasterAddr string
}

// Endpoint is a bound listener waiting to be turned into a ring by Connect.
// Its methods are safe for concurrent use.
type Endpoint struct {
	ln        *net.TCPListener
	info      PeerInfo
	closeOnce sync.Once
}

// Listen binds a TCP listener on an ephemeral port: on the advertised
// address when that is an IP of this machine, else on all interfaces. It
// does not block beyond a name lookup of MasterAddr.
func Listen(opts Options) (*Endpoint, error) {
	host := opts.Host
	if host == "" {
		host = routeTo(opts.MasterAddr)
	}
	bind := ""
	if isLocalIP(host) {
		bind = host
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(bind, "0"))
	if err != nil {
		return nil, fmt.Errorf("host: listen: %w", err)
	}
	nonce := make([]byte, 16)
	_, _ = rand.Read(nonce) // never fails on Linux
	port := ln.Addr().(*net.TCPAddr).Port
	return &Endpoint{
		ln: ln.(*net.TCPListener),
		info: PeerInfo{
			Addr:   net.JoinHostPort(host, strconv.Itoa(port)),
			HostID: hostID(),
			Nonce:  hex.EncodeToString(nonce),
		},
	}, nil
}

// Info returns what the other ranks need to reach this endpoint.
func (e *Endpoint) Info() PeerInfo { return e.info }

// Close releases the listener. Connect closes it too; later calls do
// nothing and return nil.
func (e *Endpoint) Close() error {
	var err error
	e.closeOnce.Do(func() { err = e.ln.Close() })
	return err
}

// routeTo returns the local IP that routes to master, found by "dialing" it
// over UDP (which sends no packet), or 127.0.0.1.
func routeTo(master string) string {
	if master == "" {
		return "127.0.0.1"
	}
	h, _, err := net.SplitHostPort(master)
	if err != nil {
		h = strings.Trim(master, "[]")
	}
	d := net.Dialer{Timeout: 5 * time.Second}
	c, err := d.Dial("udp", net.JoinHostPort(h, "9"))
	if err != nil {
		return "127.0.0.1"
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).IP.String()
}

// isLocalIP reports whether host is an IP address of one of this machine's
// interfaces.
func isLocalIP(host string) bool {
	ip := net.ParseIP(host)
	if ip == nil {
		return false
	}
	if ip.IsLoopback() {
		return true
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
			return true
		}
	}
	return false
}

// hostID names the machine (boot id, hostname) and the /dev/shm that ranks
// on it would share (device and inode, which differ across mount namespaces).
func hostID() string {
	boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	name, _ := os.Hostname()
	shm := "none"
	var st syscall.Stat_t
	if syscall.Stat("/dev/shm", &st) == nil {
		shm = fmt.Sprintf("%d:%d", uint64(st.Dev), uint64(st.Ino))
	}
	return fmt.Sprintf("%s/%s/%s", strings.TrimSpace(string(boot)), name, shm)
}
