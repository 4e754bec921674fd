package relay

import (
	"bytes"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// httpClient is a client for raw requests to s, over TLS pinning its
// certificate, closed with the test.
func httpClient(t *testing.T, s *Server) *http.Client {
	tr := &http.Transport{TLSClientConfig: pinnedTLS(s.Fingerprint())}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 5 * time.Second}
}

type rawReq struct {
	method, path string
	token, node  string // "-": no header
	body         []byte
}

func do(t *testing.T, hc *http.Client, addr string, r rawReq) (int, string) {
	t.Helper()
	var body io.Reader
	if r.body != nil {
		body = bytes.NewReader(r.body)
	}
	req, err := http.NewRequestWithContext(t.Context(), r.method, "https://"+addr+r.path, body)
	if err != nil {
		t.Fatal(err)
	}
	if r.token != "-" {
		req.Header.Set("Authorization", "Bearer "+r.token)
	}
	if r.node != "-" {
		req.Header.Set(hdrNode, r.node)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// TestUnauthorized: a request without the secret, or with another, gets
// 401 on every path, the time included, and reaches no Handler; the
// refusals are counted, and warned of once per warnEvery.
func TestUnauthorized(t *testing.T) {
	rec := newRecorder()
	log, logs := newTestLog(t)
	s := listen(t, "127.0.0.1:0", rec, log)
	hc := httpClient(t, s)
	good := appendRecords(nil, steps(0, 1, time.Now()), 0)
	cases := []struct {
		name string
		req  rawReq
	}{
		{"no token on time", rawReq{method: "GET", path: pathTime, token: "-", node: "n"}},
		{"wrong token on time", rawReq{method: "GET", path: pathTime, token: "job-tokem", node: "n"}},
		{"no token on records", rawReq{method: "POST", path: pathRecs, token: "-", node: "n", body: good}},
		{"wrong token on records", rawReq{method: "POST", path: pathRecs, token: "job-tokem", node: "n", body: good}},
		{"prefix of the token", rawReq{method: "POST", path: pathRecs, token: "job-", node: "n", body: good}},
		{"token and more", rawReq{method: "POST", path: pathRecs, token: testToken + "x", node: "n", body: good}},
		{"empty token on workers", rawReq{method: "POST", path: pathWork, token: "", node: "n", body: []byte(`{"workers":[{"rank":1}]}`)}},
		{"wrong token on stacks", rawReq{method: "POST", path: pathStacks, token: "x", node: "n", body: []byte(`{"stacks":{"1":"x"}}`)}},
		{"wrong token on hangs", rawReq{method: "GET", path: pathHangs, token: "x", node: "n"}},
		{"wrong token on a path that does not exist", rawReq{method: "GET", path: "/v2/nothing", token: "x", node: "n"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if code, msg := do(t, hc, s.Addr(), tc.req); code != http.StatusUnauthorized {
				t.Errorf("got %d %q, want 401", code, msg)
			}
		})
	}
	// The scheme is Bearer.
	req, _ := http.NewRequestWithContext(t.Context(), "GET", "https://"+s.Addr()+pathTime, nil)
	req.SetBasicAuth("ddp", testToken)
	if resp, err := hc.Do(req); err != nil {
		t.Errorf("basic auth: %v", err)
	} else {
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer ") {
			t.Errorf("basic auth: got %d, WWW-Authenticate %q; want 401 and a Bearer challenge", resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
		}
	}
	rec.mu.Lock()
	if len(rec.recs) != 0 || len(rec.workers) != 0 || len(rec.stacks) != 0 {
		t.Errorf("the handler got records %v, workers %v, stacks %v without the secret", rec.recs, rec.workers, rec.stacks)
	}
	rec.mu.Unlock()
	if got, want := s.Refused(), uint64(len(cases)+1); got != want {
		t.Errorf("Refused: got %d, want %d", got, want)
	}
	if n := strings.Count(logs.String(), "level=WARN msg=\"relay: refused a request without the job's secret\""); n != 1 {
		t.Errorf("%d warnings for %d refusals within %v, want 1", n, s.Refused(), warnEvery)
	}
	if code, _ := do(t, hc, s.Addr(), rawReq{method: "POST", path: pathRecs, token: testToken, node: "n", body: good}); code != http.StatusNoContent {
		t.Errorf("with the token: got %d, want 204", code)
	}
	if n := len(rec.records("n")); n != 1 {
		t.Errorf("the handler got %d records, want only the one sent with the token", n)
	}
}

// TestMalformed: every bad request gets 400 (413 when too large) and
// reaches no Handler; the server answers good ones in between.
func TestMalformed(t *testing.T) {
	rec := newRecorder()
	s := listen(t, "127.0.0.1:0", rec, nil)
	hc := httpClient(t, s)
	post := func(path, node string, body []byte) rawReq {
		return rawReq{method: "POST", path: path, token: testToken, node: node, body: body}
	}
	type tc struct {
		name string
		req  rawReq
		want int
	}
	var cases []tc
	for name, b := range malformedRecords() {
		cases = append(cases, tc{"records " + name, post(pathRecs, "n", b), http.StatusBadRequest})
	}
	good := appendRecords(nil, steps(0, 1, time.Now()), 0)
	cases = append(cases, []tc{
		{"records too large", post(pathRecs, "n", make([]byte, recordsHeader+(MaxBatch+1)*recordSize)), http.StatusRequestEntityTooLarge},
		{"records without a node", post(pathRecs, "-", good), http.StatusBadRequest},
		{"records from a node of 300 bytes", post(pathRecs, strings.Repeat("n", 300), good), http.StatusBadRequest},
		{"workers not JSON", post(pathWork, "n", []byte("workers: 1")), http.StatusBadRequest},
		{"workers cut short", post(pathWork, "n", []byte(`{"workers":[{"rank":1`)), http.StatusBadRequest},
		{"workers with trailing data", post(pathWork, "n", []byte(`{"workers":[]} {}`)), http.StatusBadRequest},
		{"workers with a negative rank", post(pathWork, "n", []byte(`{"workers":[{"rank":-1}]}`)), http.StatusBadRequest},
		{"workers with a rank too large", post(pathWork, "n", []byte(`{"workers":[{"rank":1e12}]}`)), http.StatusBadRequest},
		{"workers with a string rank", post(pathWork, "n", []byte(`{"workers":[{"rank":"1"}]}`)), http.StatusBadRequest},
		{"workers with a long host", post(pathWork, "n", []byte(`{"workers":[{"rank":1,"host":"`+strings.Repeat("h", maxText+1)+`"}]}`)), http.StatusBadRequest},
		{"workers too large", post(pathWork, "n", make([]byte, MaxBody+1)), http.StatusRequestEntityTooLarge},
		{"stacks with a bad rank", post(pathStacks, "n", []byte(`{"stacks":{"rank3":"x"}}`)), http.StatusBadRequest},
		{"stacks with a negative rank", post(pathStacks, "n", []byte(`{"stacks":{"-3":"x"}}`)), http.StatusBadRequest},
		{"stacks too long", post(pathStacks, "n", []byte(`{"stacks":{"3":"`+strings.Repeat("x", MaxStack+1)+`"}}`)), http.StatusBadRequest},
		{"stacks an array", post(pathStacks, "n", []byte(`{"stacks":["x"]}`)), http.StatusBadRequest},
		{"hangs after not a number", rawReq{method: "GET", path: pathHangs + "?after=x", token: testToken, node: "n"}, http.StatusBadRequest},
		{"hangs wait not a duration", rawReq{method: "GET", path: pathHangs + "?wait=soon", token: testToken, node: "n"}, http.StatusBadRequest},
		{"hangs negative wait", rawReq{method: "GET", path: pathHangs + "?wait=-1s", token: testToken, node: "n"}, http.StatusBadRequest},
		{"time by POST", post(pathTime, "n", nil), http.StatusMethodNotAllowed},
		{"unknown path", rawReq{method: "GET", path: "/v1/nothing", token: testToken, node: "n"}, http.StatusNotFound},
	}...)
	slices.SortFunc(cases, func(a, b tc) int { return strings.Compare(a.name, b.name) })
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if code, msg := do(t, hc, s.Addr(), c.req); code != c.want {
				t.Errorf("got %d %q, want %d", code, msg, c.want)
			} else {
				t.Logf("%d %s", code, msg)
			}
			// The server carries on.
			ok := appendRecords(nil, steps(i, 1, time.Now()), 0)
			if code, msg := do(t, hc, s.Addr(), post(pathRecs, "n", ok)); code != http.StatusNoContent {
				t.Fatalf("a good batch after it: got %d %q, want 204", code, msg)
			}
		})
	}
	if n := len(rec.records("n")); n != len(cases) {
		t.Errorf("the handler got %d records, want %d (the good ones)", n, len(cases))
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.workers) != 0 || len(rec.stacks) != 0 {
		t.Errorf("the handler got workers %v and stacks %v from malformed requests", rec.workers, rec.stacks)
	}
}

func TestListenErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		addr  string
		token string
		h     Handler
	}{
		{"empty token", "127.0.0.1:0", "", newRecorder()},
		{"nil handler", "127.0.0.1:0", testToken, nil},
		{"bad address", "127.0.0.1:99999", testToken, newRecorder()},
		{"every interface", ":0", testToken, newRecorder()},
		{"every IPv4 interface", "0.0.0.0:0", testToken, newRecorder()},
		{"every IPv6 interface", "[::]:0", testToken, newRecorder()},
		{"no port", "127.0.0.1", testToken, newRecorder()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if s, err := Listen(tc.addr, tc.token, tc.h, nil); err == nil {
				s.Close()
				t.Fatal("Listen succeeded, want an error")
			}
		})
	}
}
