package nic

import (
	"fmt"
	"strconv"
	"strings"
)

// port is one thing the detector watches: an interface of
// /sys/class/net, or one port of an InfiniBand device.
type port struct {
	Name string // the findings' subject: "eth0", "mlx5_0/1"
	IB   bool
	Dev  string // InfiniBand: the device, "mlx5_0"
	Num  string // InfiniBand: the port number, "1"
}

func netPort(name string) port    { return port{Name: name} }
func ibPort(dev, num string) port { return port{Name: dev + "/" + num, IB: true, Dev: dev, Num: num} }
func (p port) String() string     { return p.Name }

// portState is what one look at a port found.
type portState struct {
	Present bool   // it exists (an interface can vanish: a driver reset, a hot unplug)
	Err     error  // it could not be read (or the read hung); the rest is unknown
	Up      bool   // it can carry traffic
	State   string // the kernel's words for it, for the message: "operstate down, no carrier"
	// Changes counts the link's transitions: carrier_changes (every down
	// and every up) for an interface, counters/link_downed (downs only)
	// for an InfiniBand port; -1 when the kernel does not say.
	Changes  int64
	RateMbps int64 // the link's rate; -1 unknown (down, virtual)
}

// The kernel's words for a port that can carry traffic.
const (
	ibActive = "ACTIVE" // /sys/class/infiniband/*/ports/*/state: "4: ACTIVE"
	ibLinkUp = "LinkUp" // .../phys_state: "5: LinkUp"
)

// netUp says whether an interface with this operstate and carrier can
// carry traffic. "unknown" is what drivers that do not track operstate
// (tun, some virtual ones) report while working.
func netUp(operstate string, carrier bool) bool {
	return carrier && (operstate == "up" || operstate == "unknown")
}

// ibUp says the same of an InfiniBand port: ACTIVE is the only logical
// state that carries data (INIT and ARMED do not yet), and LinkUp the
// only physical one.
func ibUp(state, physState string) bool {
	return ibStateName(state) == ibActive && ibStateName(physState) == ibLinkUp
}

// ibStateName drops the number of "4: ACTIVE".
func ibStateName(s string) string {
	if _, name, ok := strings.Cut(s, ": "); ok {
		return strings.TrimSpace(name)
	}
	return strings.TrimSpace(s)
}

// parseIBRate reads an InfiniBand port's rate ("100 Gb/sec (4X EDR)",
// "2.5 Gb/sec (1X SDR)") in Mb/s, -1 when it is not one.
func parseIBRate(s string) int64 {
	f := strings.Fields(s)
	if len(f) < 2 || f[1] != "Gb/sec" {
		return -1
	}
	gbps, err := strconv.ParseFloat(f[0], 64)
	if err != nil || gbps <= 0 {
		return -1
	}
	return int64(gbps * 1000)
}

// validName refuses what could not be one path element of sysfs, so that
// an option value never reaches outside it.
func validName(s string) error {
	if s == "" || s == "." || s == ".." || strings.ContainsAny(s, "/\x00") {
		return fmt.Errorf("%q is not an interface or device name", s)
	}
	return nil
}
