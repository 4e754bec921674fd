package nic

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

func netDir(sysfs, name string) string { return filepath.Join(sysfs, "class", "net", name) }
func ibDir(sysfs, dev string) string   { return filepath.Join(sysfs, "class", "infiniband", dev) }
func ibPortDir(sysfs string, p port) string {
	return filepath.Join(ibDir(sysfs, p.Dev), "ports", p.Num)
}

// readPort looks at a port in sysfs.
func readPort(sysfs string, p port) portState {
	if p.IB {
		return readIB(ibPortDir(sysfs, p))
	}
	return readNet(netDir(sysfs, p.Name))
}

func readNet(dir string) portState {
	oper, err := readString(filepath.Join(dir, "operstate"))
	if err != nil {
		return unreadable(dir, err)
	}
	// carrier cannot be read (EINVAL) while the interface is down by
	// admin: it then has none.
	carrierText, _ := readString(filepath.Join(dir, "carrier"))
	carrier := carrierText == "1"
	st := portState{
		Present:  true,
		Up:       netUp(oper, carrier),
		State:    "operstate " + oper + ", no carrier",
		Changes:  readInt(filepath.Join(dir, "carrier_changes")),
		RateMbps: readInt(filepath.Join(dir, "speed")), // -1 for "unknown" too
	}
	if carrier {
		st.State = "operstate " + oper + ", carrier"
	}
	if st.RateMbps <= 0 {
		st.RateMbps = -1
	}
	return st
}

func readIB(dir string) portState {
	state, err := readString(filepath.Join(dir, "state"))
	if err != nil {
		return unreadable(dir, err)
	}
	phys, _ := readString(filepath.Join(dir, "phys_state"))
	rate, _ := readString(filepath.Join(dir, "rate"))
	return portState{
		Present:  true,
		Up:       ibUp(state, phys),
		State:    fmt.Sprintf("state %s, phys_state %s", state, phys),
		Changes:  readInt(filepath.Join(dir, "counters", "link_downed")),
		RateMbps: parseIBRate(rate),
	}
}

// unreadable is the state of a port whose first file could not be read:
// gone when its directory is, unknown otherwise.
func unreadable(dir string, err error) portState {
	if _, statErr := os.Stat(dir); errors.Is(statErr, fs.ErrNotExist) {
		return portState{Changes: -1, RateMbps: -1}
	}
	return portState{Present: true, Err: err, Changes: -1, RateMbps: -1}
}

func readString(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// readInt reads a number file, -1 when it is missing or not a number.
func readInt(path string) int64 {
	s, err := readString(path)
	if err != nil {
		return -1
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// candidate is a port found on the node, for the default choice.
type candidate struct {
	port
	device bool // backed by a device (/sys/class/net/X/device): not a veth, bridge or tunnel
	state  portState
}

// listPorts finds every interface and InfiniBand port in sysfs.
func listPorts(sysfs string) ([]candidate, error) {
	nets, err := os.ReadDir(filepath.Join(sysfs, "class", "net"))
	if err != nil {
		return nil, fmt.Errorf("list interfaces: %w", err)
	}
	var out []candidate
	for _, e := range nets {
		_, devErr := os.Stat(filepath.Join(netDir(sysfs, e.Name()), "device"))
		p := netPort(e.Name())
		out = append(out, candidate{port: p, device: devErr == nil, state: readPort(sysfs, p)})
	}
	devs, err := os.ReadDir(filepath.Join(sysfs, "class", "infiniband"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("list InfiniBand devices: %w", err)
	}
	for _, d := range devs {
		ports, err := listIBPorts(sysfs, d.Name())
		if err != nil {
			return nil, err
		}
		for _, p := range ports {
			out = append(out, candidate{port: p, device: true, state: readPort(sysfs, p)})
		}
	}
	return out, nil
}

// listIBPorts finds an InfiniBand device's ports.
func listIBPorts(sysfs, dev string) ([]port, error) {
	es, err := os.ReadDir(filepath.Join(ibDir(sysfs, dev), "ports"))
	if err != nil {
		return nil, fmt.Errorf("list the ports of InfiniBand device %s: %w", dev, err)
	}
	var out []port
	for _, e := range es {
		out = append(out, ibPort(dev, e.Name()))
	}
	return out, nil
}
