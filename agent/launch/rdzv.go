package launch

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// RdzvConf is a parsed --rdzv-conf. Keys are torchrun's where torchrun has
// one for the same thing.
type RdzvConf struct {
	JoinTimeout         time.Duration // join_timeout (torchrun: join_timeout, etcd backend: timeout)
	LastCall            time.Duration // last_call_timeout
	KeepAliveInterval   time.Duration // keep_alive_interval
	KeepAliveMaxAttempt int           // keep_alive_max_attempt: missed keep-alives before a node is lost
	IsHost              *bool         // is_host: whether this agent hosts the store (c10d); nil = decide by address
	CACert, Cert, Key   string        // cacert, cert, key: TLS to the store (etcd backend)
	Protocol            string        // protocol: http or https (etcd backend)
	Prefix              string        // etcd_prefix: where jobs live in the store
	StoreQuota          int64         // store_quota: bytes the hosted store may hold (etcd's --quota-backend-bytes)
}

// TTL is how long a silent node keeps its lease: the keep-alive interval
// times the attempts it may miss.
func (c RdzvConf) TTL() time.Duration {
	return c.KeepAliveInterval * time.Duration(c.KeepAliveMaxAttempt)
}

// DefaultRdzvConf: torchrun waits 30 s of last call and declares a node
// dead after 3 missed keep-alives 5 s apart; a fault should cost seconds.
var DefaultRdzvConf = RdzvConf{
	JoinTimeout:         600 * time.Second,
	LastCall:            2 * time.Second,
	KeepAliveInterval:   time.Second,
	KeepAliveMaxAttempt: 3,
	Prefix:              "/ddp-agent/v1/",
	StoreQuota:          2 << 30, // etcd's default
}

// Bounds on store_quota: etcd warns above 8 GiB, and a store smaller than
// a few MiB cannot hold one generation of a small job.
const (
	minStoreQuota = 4 << 20
	maxStoreQuota = 8 << 30
)

// torchrun keys that mean nothing here; accepted so a torchrun command
// line keeps working.
var ignoredRdzvKeys = map[string]bool{"read_timeout": true, "close_timeout": true, "heartbeat": true, "timeout_s": true, "use_libuv": true, "store_type": true}

func parseRdzvConf(v string) (RdzvConf, error) {
	c := DefaultRdzvConf
	if strings.TrimSpace(v) == "" {
		return c, nil
	}
	for _, kv := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(kv, "=")
		k, val = strings.TrimSpace(k), strings.TrimSpace(val)
		if !ok || k == "" {
			return c, usagef("--rdzv-conf: %q is not key=value", kv)
		}
		secs := func() (time.Duration, error) {
			f, err := strconv.ParseFloat(val, 64)
			if err != nil || f <= 0 {
				if d, err := time.ParseDuration(val); err == nil && d > 0 {
					return d, nil
				}
				return 0, usagef("--rdzv-conf %s: %q is not a positive number of seconds", k, val)
			}
			return time.Duration(f * float64(time.Second)), nil
		}
		var err error
		switch k {
		case "join_timeout", "timeout":
			c.JoinTimeout, err = secs()
		case "last_call_timeout":
			c.LastCall, err = secs()
			if val == "0" {
				c.LastCall, err = 0, nil
			}
		case "keep_alive_interval":
			c.KeepAliveInterval, err = secs()
		case "keep_alive_max_attempt":
			n, perr := strconv.Atoi(val)
			if perr != nil || n < 1 {
				return c, usagef("--rdzv-conf keep_alive_max_attempt: %q is not a positive integer", val)
			}
			c.KeepAliveMaxAttempt = n
		case "is_host":
			b, perr := strconv.ParseBool(val)
			if perr != nil {
				return c, usagef("--rdzv-conf is_host: %q is not true or false", val)
			}
			c.IsHost = &b
		case "cacert":
			c.CACert = val
		case "cert":
			c.Cert = val
		case "key":
			c.Key = val
		case "protocol":
			if val != "http" && val != "https" {
				return c, usagef("--rdzv-conf protocol: %q is not http or https", val)
			}
			c.Protocol = val
		case "store_quota":
			c.StoreQuota, err = parseStoreQuota(val)
		case "etcd_prefix":
			if val == "" {
				return c, usagef("--rdzv-conf etcd_prefix must not be empty")
			}
			c.Prefix = strings.TrimRight(val, "/") + "/"
		default:
			if !ignoredRdzvKeys[k] {
				return c, usagef("--rdzv-conf: unknown key %q (known: join_timeout, last_call_timeout, keep_alive_interval, keep_alive_max_attempt, is_host, protocol, cacert, cert, key, etcd_prefix, store_quota)", k)
			}
		}
		if err != nil {
			return c, err
		}
	}
	if (c.Cert == "") != (c.Key == "") {
		return c, usagef("--rdzv-conf: cert and key go together")
	}
	if c.TTL() < 2*time.Second {
		// etcd does not grant leases shorter than its minimum TTL (about 2 s
		// with its default timings); a shorter one would silently be longer.
		return c, usagef("--rdzv-conf: keep_alive_interval x keep_alive_max_attempt = %v; it must be at least 2s", c.TTL())
	}
	return c, nil
}

// parseStoreQuota reads a byte count: a number with an optional binary
// unit (KiB, MiB, GiB; K, M, G mean the same).
func parseStoreQuota(v string) (int64, error) {
	num, unit := v, int64(1)
	for _, u := range []struct {
		suffix string
		size   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}} {
		if n, ok := strings.CutSuffix(v, u.suffix); ok {
			num, unit = strings.TrimSpace(n), u.size
			break
		}
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || f*float64(unit) < minStoreQuota || f*float64(unit) > maxStoreQuota {
		return 0, usagef("--rdzv-conf store_quota: %q is not a size from 4MiB to 8GiB", v)
	}
	return int64(f * float64(unit)), nil
}

// Dynamic reports whether the nodes meet through an etcd store (c10d or
// etcd backend, or --standalone) rather than by fixed ranks.
func (c *Config) Dynamic() bool {
	return c.Standalone || (c.RdzvBackend != "static" && c.RdzvEndpoint != "")
}

// Endpoints returns --rdzv-endpoint as a list with ports filled in: 29400
// for c10d, as torchrun, and 2379 for etcd.
func (c *Config) Endpoints() []string {
	port := "29400"
	if c.RdzvBackend == "etcd" || c.RdzvBackend == "etcd-v2" {
		port = "2379"
	}
	var eps []string
	for _, ep := range strings.Split(c.RdzvEndpoint, ",") {
		ep = strings.TrimSpace(ep)
		if ep == "" {
			continue
		}
		if strings.Contains(ep, "://") {
			eps = append(eps, ep)
			continue
		}
		if _, _, err := net.SplitHostPort(ep); err != nil {
			ep = net.JoinHostPort(strings.Trim(ep, "[]"), port)
		}
		eps = append(eps, ep)
	}
	return eps
}

// ExternalStore reports whether the store is an existing etcd cluster
// that no agent hosts.
func (c *Config) ExternalStore() bool {
	return c.RdzvBackend == "etcd" || c.RdzvBackend == "etcd-v2"
}

func (c *Config) checkRendezvous(set map[string]bool) error {
	if c.Standalone {
		if c.NNodesMax != 1 {
			return usagef("--standalone is for one node; use --rdzv-endpoint for --nnodes %d:%d", c.NNodesMin, c.NNodesMax)
		}
		if set["rdzv-endpoint"] {
			return usagef("--standalone hosts its own store; drop --rdzv-endpoint, or drop --standalone")
		}
		if set["node-rank"] && c.NodeRank != 0 {
			return usagef("--node-rank %d: --standalone is one node, group rank 0; drop --node-rank", c.NodeRank)
		}
		// A PET_NODE_RANK left in the environment (a Kubeflow pod's) is
		// ignored, as torchrun does: kept, it gave the only worker RANK 1 of
		// WORLD_SIZE 1, and init_process_group waited forever.
		c.NodeRank = 0
		return nil
	}
	if c.RdzvBackend == "static" && c.RdzvEndpoint != "" {
		if err := c.staticEndpoint(set); err != nil {
			return err
		}
	}
	if c.RdzvBackend == "static" || c.RdzvEndpoint == "" {
		if c.RdzvBackend != "static" && c.NNodesMax > 1 {
			return usagef("--rdzv-backend %s with --nnodes %d:%d needs --rdzv-endpoint (the store's host:port)", c.RdzvBackend, c.NNodesMin, c.NNodesMax)
		}
		if c.NNodesMin != c.NNodesMax {
			return usagef("--nnodes %d:%d is elastic and needs a rendezvous store: add --rdzv-backend c10d --rdzv-endpoint HOST:PORT", c.NNodesMin, c.NNodesMax)
		}
		if c.NodeRank >= c.NNodesMax {
			return usagef("--node-rank %d must be below --nnodes %d", c.NodeRank, c.NNodesMax)
		}
		if c.NNodesMax > 1 && c.MasterPort == 0 {
			c.MasterPort = 29500 // every node must agree on it, as in torchrun
		}
		if c.NNodesMax > 1 && c.RdzvID == "" {
			// torchrun's default: the same run id (TORCHELASTIC_RUN_ID, the
			// log directory's name) on every node of the job. One node
			// alone keeps a random one, so its runs' log dirs differ.
			c.RdzvID = "none"
		}
		return nil
	}
	if set["node-rank"] {
		return usagef("--node-rank is for the static backend; with --rdzv-backend %s the rendezvous assigns ranks", c.RdzvBackend)
	}
	c.NodeRank = 0 // the store assigns ranks; a PET_NODE_RANK is ignored, as torchrun does
	if len(c.Endpoints()) == 0 {
		return usagef("--rdzv-endpoint %q names no store", c.RdzvEndpoint)
	}
	for _, ep := range c.Endpoints() {
		// Port 0 picks a free port as the agent hosts the store: c10d only.
		if err := checkEndpoint(ep, c.NNodesMax == 1 && !c.ExternalStore()); err != nil {
			return usagef("--rdzv-endpoint %q: %v", c.RdzvEndpoint, err)
		}
	}
	if !c.ExternalStore() && len(c.Endpoints()) > 1 {
		return usagef("--rdzv-backend c10d takes one endpoint (the agent that hosts the store); for an etcd cluster use --rdzv-backend etcd")
	}
	if c.RdzvID == "" {
		c.RdzvID = "none" // what torchrun uses when --rdzv-id is not given: the same on every node
	}
	return nil
}

// staticEndpoint takes --rdzv-endpoint HOST:PORT under the static backend
// as the workers' master, as torchrun does (its static rendezvous serves
// there); ignored, every node but rank 0's dialled its own loopback. It
// must agree with --master-addr and --master-port where they are given.
func (c *Config) staticEndpoint(set map[string]bool) error {
	ep := strings.TrimSpace(c.RdzvEndpoint)
	if err := checkEndpoint(ep, false); err != nil || strings.Contains(ep, "://") {
		return usagef("--rdzv-backend static --rdzv-endpoint %q: want the master's HOST:PORT (1..65535), as --master-addr and --master-port give it", c.RdzvEndpoint)
	}
	host, p, _ := net.SplitHostPort(ep) // checked
	port, _ := strconv.Atoi(p)
	if (set["master-addr"] && c.MasterAddr != host) || (set["master-port"] && c.MasterPort != port) {
		return usagef("--rdzv-endpoint %s and --master-addr/--master-port %s:%d name different masters; give one of them",
			c.RdzvEndpoint, c.MasterAddr, c.MasterPort)
	}
	c.MasterAddr, c.MasterPort = host, port
	return nil
}

// checkEndpoint rejects a store endpoint (from Endpoints) that no dial can
// reach, before anything starts: a bad one was retried as "not reachable
// yet" until the join timeout (10 minutes by default). Port 0, a free port
// that the agent picks as it hosts the store, is for a job of one node
// whose agent hosts it (alone): no other node could find it.
func checkEndpoint(ep string, alone bool) error {
	if strings.Contains(ep, "://") {
		u, err := url.Parse(ep)
		if err != nil || u.Host == "" {
			return fmt.Errorf("%q is not a URL with a host", ep)
		}
		ep = u.Host
		if u.Port() == "" {
			return nil
		}
	}
	host, p, err := net.SplitHostPort(ep)
	switch {
	case err != nil:
		return fmt.Errorf("%q is not HOST:PORT", ep)
	case host == "":
		return fmt.Errorf("%q names no host", ep)
	case strings.Contains(host, ":") && !validIP(host):
		return fmt.Errorf("%q is neither a host name nor an IP address", host)
	}
	port, err := strconv.Atoi(p)
	switch {
	case err != nil || port < 0 || port > 65535:
		return fmt.Errorf("the port of %q must be 1..65535", ep)
	case port == 0 && !alone:
		return fmt.Errorf("port 0 picks a free port as the store starts, which the other nodes cannot know; give the port")
	}
	return nil
}

// validIP reports whether host is an IP address, an IPv6 one with a zone
// (fe80::1%eth0) too.
func validIP(host string) bool {
	_, err := netip.ParseAddr(host)
	return err == nil
}
