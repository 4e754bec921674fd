package nic

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// resolvePorts turns the interfaces option into ports: the named ones,
// each checked to exist, or the default choice when none are named.
func resolvePorts(sysfs string, names []string) ([]port, error) {
	if len(names) == 0 {
		cands, err := listPorts(sysfs)
		if err != nil {
			return nil, err
		}
		ports := defaultPorts(cands)
		if len(ports) == 0 {
			return nil, errors.New("option interfaces: no interface other than lo is up in " + sysfs +
				"/class/net, nor any InfiniBand port ACTIVE: name the ones the job uses")
		}
		return ports, nil
	}
	var out []port
	seen := map[string]bool{}
	for _, n := range names {
		ps, err := resolveName(sysfs, n)
		if err != nil {
			return nil, fmt.Errorf("option interfaces: %w", err)
		}
		for _, p := range ps {
			if !seen[p.Name] {
				seen[p.Name] = true
				out = append(out, p)
			}
		}
	}
	return out, nil
}

// resolveName finds what one name of the interfaces option is: an
// InfiniBand port ("mlx5_0/1"), an interface ("eth0"), or an InfiniBand
// device ("mlx5_0": all its ports).
func resolveName(sysfs, name string) ([]port, error) {
	if dev, num, ok := strings.Cut(name, "/"); ok {
		if err := errors.Join(validName(dev), validName(num)); err != nil {
			return nil, err
		}
		p := ibPort(dev, num)
		if !exists(ibPortDir(sysfs, p)) {
			return nil, fmt.Errorf("no InfiniBand port %s (%s does not exist)", name, ibPortDir(sysfs, p))
		}
		return []port{p}, nil
	}
	if err := validName(name); err != nil {
		return nil, err
	}
	if exists(netDir(sysfs, name)) {
		return []port{netPort(name)}, nil
	}
	if exists(ibDir(sysfs, name)) {
		return listIBPorts(sysfs, name)
	}
	return nil, fmt.Errorf("no interface %q in %s, nor InfiniBand device in %s",
		name, filepath.Join(sysfs, "class", "net"), filepath.Join(sysfs, "class", "infiniband"))
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// defaultPorts chooses what to watch when the user named nothing: the
// ports up now, never lo (nothing leaves the node through it). Of the
// interfaces, those backed by a device when there are any: on a host the
// others (veths, bridges, tunnels) come and go with other workloads, and
// one vanishing must not drain the node. In a container there are none,
// and its veth (eth0) is the way out, so the others are taken then.
// Every ACTIVE InfiniBand port is taken.
func defaultPorts(cands []candidate) []port {
	var ib, device, virtual []port
	for _, c := range cands {
		switch {
		case c.Name == "lo" || !c.state.Present || !c.state.Up:
		case c.IB:
			ib = append(ib, c.port)
		case c.device:
			device = append(device, c.port)
		default:
			virtual = append(virtual, c.port)
		}
	}
	if len(device) == 0 {
		device = virtual
	}
	return append(device, ib...)
}
