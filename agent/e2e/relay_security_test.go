package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/rdzv"
	"github.com/ddp-agent/ddp-agent/agent/rdzv/store"
	"github.com/ddp-agent/ddp-agent/agent/telemetry"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/relay"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/watch"
	"github.com/ddp-agent/ddp-agent/wire"
)

// forgedBucket marks the forged collectives: no real DDP bucket has it.
const forgedBucket = 900

// TestRelayRefusesStrangers (issue 17): two agents × 1 worker training,
// the store on loopback, without --rdzv-token and with one. While the job
// runs, the leader's relay (its endpoint read from the store):
//
//   - listens on the address the agents use (127.0.0.1) only: the same
//     port on 127.0.0.2 and on this machine's other address refuses;
//   - speaks no plain HTTP;
//   - answers 401 to an HTTPS POST of forged records (rank 1 late in a
//     bucket of their own) without the secret, with the token the job id
//     alone used to give, or with a made-up one, and logs no stall for
//     them;
//
// and, to show the forgery would have worked, the same records sent by a
// relay client with the secret (the one the store holds, or the one
// derived from --rdzv-token) do make stall lines.
func TestRelayRefusesStrangers(t *testing.T) {
	budgetAlongside(t, 45*time.Second)
	needTorch(t)
	t.Run("no --rdzv-token", func(t *testing.T) { checkRelay(t, "") })
	t.Run("--rdzv-token", func(t *testing.T) { checkRelay(t, "s3cret-s3cret-s3cret") })
}

func checkRelay(t *testing.T, rdzvToken string) {
	logDir := t.TempDir()
	id := "relaysec" + strconv.Itoa(freePort(t))
	endpoint := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	args := rdzvArgs(endpoint, id, 2, 0, 1, logDir)
	if rdzvToken != "" {
		args = append(args, "--rdzv-token", rdzvToken)
	}
	args = append(args, filepath.Join(repoRoot, "examples", "train.py"), "--steps", "100000", "--sleep-per-step", "0.05",
		"--batch-size", "4", "--log-every", "20", "--ckpt-every", "0", "--ckpt-dir", t.TempDir())
	a := startAgent(t, nil, args...)
	waitFor(t, 30*time.Second, func() bool { return strings.Contains(a.stderr.String(), "hosting the rendezvous store") }, a.logs)
	b := startAgent(t, nil, args...)
	logs := func() string { return a.stderr.String() + b.stderr.String() }
	dump := func() string { return a.logs() + "\n----\n" + b.logs() }

	ep := leaderEndpoint(t, endpoint, id, rdzvToken)
	t.Logf("the leader's relay: %s, certificate sha256 %s, secret published: %v", ep.Addr, ep.Fingerprint, ep.Secret != "")
	host, port, _ := net.SplitHostPort(ep.Addr)
	if host != "127.0.0.1" || (ep.Secret == "") != (rdzvToken != "") {
		t.Fatalf("endpoint %s, secret published %v; want 127.0.0.1, and a secret only without --rdzv-token\n%s", ep.Addr, ep.Secret != "", dump())
	}
	// The job is under way: the follower reached the relay, the workers train.
	waitFor(t, 60*time.Second, func() bool {
		return strings.Contains(logs(), "relay: follower connected") && strings.Contains(a.stdout.String()+b.stdout.String(), "step 20 ")
	}, dump)

	t.Run("bound to one address", func(t *testing.T) { checkOnlyOn(t, port) })
	t.Run("no plain HTTP", func(t *testing.T) { checkNoPlainHTTP(t, ep.Addr) })

	// Forged records without the secret: refused, and no stall.
	hc := strangerClient(t)
	forged := forgedBatch(time.Now())
	for name, token := range map[string]string{
		"no token":                      "",
		"the token of the job id alone": relay.JobToken(id, ""),
		"a made-up token":               strings.Repeat("0", 64),
	} {
		if code := postRecords(t, hc, ep.Addr, token, forged); code != http.StatusUnauthorized {
			t.Errorf("forged records with %s: got %d, want 401", name, code)
		}
	}
	waitFor(t, 5*time.Second, func() bool { return strings.Contains(logs(), "relay: refused a request without the job's secret") }, dump)
	time.Sleep(2500 * time.Millisecond) // the analyzer's and the straggler look's periods, had anything got through
	forgedStall := regexp.MustCompile(`stall: step \d+ bucket ` + strconv.Itoa(forgedBucket) + `:`)
	if l := forgedStall.FindString(logs()); l != "" {
		t.Fatalf("the forged records without the secret made the leader log %q\n%s", l, dump())
	}

	// The positive control: the same records with the secret.
	secret, err := relay.FollowerToken(ep, id, rdzv.StretchToken(rdzvToken))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	c, err := relay.Dial(ctx, relay.ClientConfig{Addr: ep.Addr, Fingerprint: ep.Fingerprint, Node: "intruder", Token: secret})
	if err != nil {
		t.Fatalf("dial with the secret: %v\n%s", err, dump())
	}
	c.Send(forgedRecords(time.Now()))
	// A deadline, not a duration: at load 12 the analyzer took longer than 10 s.
	waitFor(t, 60*time.Second, func() bool { return forgedStall.MatchString(logs()) }, dump)
	c.Close()
	for _, l := range regexp.MustCompile(`.*(relay: |bucket `+strconv.Itoa(forgedBucket)+`).*`).FindAllString(logs(), -1) {
		t.Log(l)
	}

	for _, r := range []*agentRun{a, b} {
		r.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, r := range []*agentRun{a, b} {
		r.wait(30 * time.Second)
	}
}

// leaderEndpoint reads the endpoint the leader of generation 0 published
// in the job's store; with a token, through the job's certificates, as
// the store admits nobody else.
func leaderEndpoint(t *testing.T, endpoint, id, token string) relay.Endpoint {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var tlsFiles *store.TLSFiles
	if token != "" {
		job, err := store.OpenJobTLS(rdzv.StretchToken(token))
		if err != nil {
			t.Fatal(err)
		}
		defer job.Close()
		tlsFiles = job.Files
	}
	cli, err := store.Dial(ctx, store.ClientConfig{Endpoints: []string{endpoint}, TLS: tlsFiles})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	kv := store.NewKV(cli, rdzv.KVPrefix(rdzv.Prefix(rdzv.RootPrefix, id)))
	raw, err := kv.Get(ctx, watch.LeaderKey(id, 0))
	if err != nil {
		t.Fatalf("the leader's relay endpoint: %v", err)
	}
	ep, err := relay.DecodeEndpoint(raw)
	if err != nil {
		t.Fatal(err)
	}
	return ep
}

// checkOnlyOn: nothing accepts connections on port at 127.0.0.2 (a relay
// on every interface would: Linux routes 127/8 to loopback) and at this
// machine's first non-loopback IPv4 address, when it has one.
func checkOnlyOn(t *testing.T, port string) {
	others := []string{"127.0.0.2"}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			others = append(others, n.IP.String())
			break
		}
	}
	if len(others) == 1 {
		t.Log("this machine has no address besides loopback: checked 127.0.0.2 only")
	}
	for _, h := range others {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(h, port), 2*time.Second)
		if err == nil {
			c.Close()
			t.Errorf("%s:%s accepted a connection: the relay listens beyond 127.0.0.1", h, port)
		} else if !errors.Is(err, syscall.ECONNREFUSED) { // a firewall's drop, say: not accepted either
			t.Logf("%s:%s: %v (not refused, but not accepted)", h, port, err)
		} else {
			t.Logf("%s:%s: refused", h, port)
		}
	}
}

// checkNoPlainHTTP: a plain HTTP request gets net/http's 400 for HTTP on
// an HTTPS port.
func checkNoPlainHTTP(t *testing.T, addr string) {
	tr := &http.Transport{Proxy: nil}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get("http://" + addr + "/v1/time")
	if err != nil {
		t.Logf("plain HTTP: %v", err)
		return
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("plain HTTP: got %d %q, want 400", resp.StatusCode, body)
	}
	t.Logf("plain HTTP: %d %q", resp.StatusCode, bytes.TrimSpace(body))
}

// strangerClient speaks HTTPS to anyone: a stranger has no fingerprint to
// pin, and needs none to try.
func strangerClient(t *testing.T) *http.Client {
	tr := &http.Transport{Proxy: nil, TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 5 * time.Second}
}

func postRecords(t *testing.T, hc *http.Client, addr, token string, body []byte) int {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), "POST", "https://"+addr+"/v1/records", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-ddp-records")
	req.Header.Set("Ddp-Node", "intruder")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("POST forged records: %v", err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// forgedRecords are 15 collectives of generation 0 on ranks 0 and 1 in a
// bucket of their own: 12 of 10 ms, then 3 that rank 1 joins 500 ms late.
func forgedRecords(at time.Time) []telemetry.Record {
	var recs []telemetry.Record
	for i := range 15 {
		t0 := at.Add(time.Duration(i) * 600 * time.Millisecond)
		late := time.Duration(0)
		if i >= 12 {
			late = 500 * time.Millisecond
		}
		end := t0.Add(late + 10*time.Millisecond)
		for rank := range 2 {
			arrive := t0
			if rank == 1 {
				arrive = t0.Add(late)
			}
			recs = append(recs, telemetry.Record{Gen: 0, Step: uint64(1_000_000 + i), Bucket: forgedBucket, Rank: rank,
				Bytes: 4 << 20, DType: 7, Arrive: arrive, Start: arrive, End: end})
		}
	}
	return recs
}

// forgedBatch is forgedRecords as the body of POST /v1/records (the
// layout in package relay's comment).
func forgedBatch(at time.Time) []byte {
	recs := forgedRecords(at)
	b := append([]byte("DDPR"), 1, 0, 0, 0)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(recs)))
	b = binary.LittleEndian.AppendUint64(b, 0)
	for _, r := range recs {
		b = wire.AppendRanked(b, wire.RankedEvent{Gen: r.Gen, Rank: uint32(r.Rank), CollectiveEvent: wire.CollectiveEvent{
			Step: r.Step, Bucket: r.Bucket, Bytes: r.Bytes, DType: r.DType,
			TArrive: r.Arrive.UnixNano(), TStart: r.Start.UnixNano(), TEnd: r.End.UnixNano()}})
	}
	return b
}
