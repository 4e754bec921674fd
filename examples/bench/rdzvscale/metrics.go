package main

import (
	"bufio"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// metricNames are the server counters -detail reports. The grpc_server_*
// ones are kept per gRPC method.
var metricNames = []string{
	"grpc_server_msg_received_total",
	"grpc_server_msg_sent_total",
	"etcd_network_client_grpc_received_bytes_total",
	"etcd_network_client_grpc_sent_bytes_total",
	"etcd_server_proposals_committed_total",
	"etcd_server_slow_apply_total",
	"etcd_server_slow_read_indexes_total",
	"etcd_server_read_indexes_failed_total",
	"etcd_mvcc_range_total",
	"etcd_mvcc_txn_total",
	"etcd_mvcc_put_total",
	"etcd_mvcc_delete_total",
	"etcd_debugging_mvcc_events_total",
	"etcd_debugging_mvcc_slow_watcher_total",
	"etcd_debugging_mvcc_watcher_total",
	"etcd_debugging_mvcc_watch_stream_total",
	"etcd_debugging_lease_granted_total",
	"etcd_debugging_lease_renewed_total",
	"etcd_debugging_lease_revoked_total",
	"etcd_disk_backend_commit_duration_seconds_count",
}

// gauges are the metricNames that are not counters: -detail shows their
// value at the end of a phase, not their increase.
var gauges = map[string]bool{
	"etcd_debugging_mvcc_slow_watcher_total": true,
	"etcd_debugging_mvcc_watcher_total":      true,
	"etcd_debugging_mvcc_watch_stream_total": true,
}

// scrape reads the metricNames from the server's /metrics; nil if it
// cannot. With a cluster the caller passes the first member's endpoint:
// the members run in one process and register their metrics on its one
// Prometheus registry, so what that member serves is the counters of all
// the members together (a write applied on each member counts once per
// member; etcd's gauges, such as proposals committed, are whichever
// member's set them last).
func scrape(endpoint string) map[string]float64 {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + endpoint + "/metrics")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	want := map[string]bool{}
	for _, n := range metricNames {
		want[n] = true
	}
	m := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, labels := line, ""
		if i := strings.IndexByte(line, '{'); i >= 0 {
			name = line[:i]
			if j := strings.IndexByte(line, '}'); j > i {
				labels = line[i+1 : j]
			}
		} else if i := strings.IndexByte(line, ' '); i >= 0 {
			name = line[:i]
		}
		if !want[name] {
			continue
		}
		rest := line[len(name):]
		if i := strings.LastIndexByte(rest, '}'); i >= 0 {
			rest = rest[i+1:]
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		key := name
		if strings.HasPrefix(name, "grpc_server_") {
			method := labelValue(labels, "grpc_method")
			if method == "" {
				continue
			}
			key = name + "{" + method + "}"
		}
		m[key] += v
	}
	return m
}

func labelValue(labels, name string) string {
	for _, kv := range strings.Split(labels, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok && k == name {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}

// metricDeltas is what the counters of m1 grew by since m0 (those that did),
// and the gauges as they are in m1.
func metricDeltas(m0, m1 map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for key, v := range m1 {
		if gauges[key] {
			out[key] = v
		} else if d := v - m0[key]; d != 0 {
			out[key] = d
		}
	}
	return out
}
