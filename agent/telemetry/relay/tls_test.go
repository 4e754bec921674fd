package relay

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestHappyPathOverTLS: a follower pinning the leader's certificate gets
// its records, workers and stacks through, over TLS 1.3, and the
// certificate is the self-signed ECDSA P-256 one for the bind address.
func TestHappyPathOverTLS(t *testing.T) {
	rec := newRecorder()
	s := listen(t, "127.0.0.1:0", rec, nil)
	c := dial(t, ClientConfig{Addr: s.Addr(), Fingerprint: s.Fingerprint(), Node: "n", FlushEvery: 10 * time.Millisecond})
	c.Send(steps(0, 5, time.Now()))
	c.SendStacks(map[int]string{3: "stack"})
	waitFor(t, "records and stacks", 5*time.Second, func() bool {
		return len(rec.records("n")) == 5 && rec.allStacks("n")[3] == "stack"
	})

	hc := httpClient(t, s)
	req, _ := http.NewRequestWithContext(t.Context(), "GET", "https://"+s.Addr()+pathTime, nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	st := resp.TLS
	if st == nil || st.Version != tls.VersionTLS13 {
		t.Fatalf("connection state %+v, want TLS 1.3", st)
	}
	cert := st.PeerCertificates[0]
	if fingerprint(cert.Raw) != s.Fingerprint() {
		t.Error("the certificate served is not the one fingerprinted")
	}
	if k, ok := cert.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() {
		t.Errorf("key %T, want ECDSA P-256", cert.PublicKey)
	}
	if len(cert.IPAddresses) != 1 || !cert.IPAddresses[0].Equal(net.IPv4(127, 0, 0, 1)) || len(cert.DNSNames) != 0 {
		t.Errorf("SAN: IPs %v, names %v; want 127.0.0.1 only", cert.IPAddresses, cert.DNSNames)
	}
	if err := cert.CheckSignature(cert.SignatureAlgorithm, cert.RawTBSCertificate, cert.Signature); err != nil {
		t.Errorf("not self-signed: %v", err)
	}
	if now := time.Now(); cert.NotBefore.After(now) || cert.NotAfter.Before(now.AddDate(1, 0, 0)) {
		t.Errorf("valid %v to %v: want now and long after", cert.NotBefore, cert.NotAfter)
	}
}

// TestPinnedElsewhere: a follower pinning another certificate (the one
// published for another leader) fails to connect at once, sends nothing,
// and is never asked for the secret.
func TestPinnedElsewhere(t *testing.T) {
	rec := newRecorder()
	s := listen(t, "127.0.0.1:0", rec, nil)
	other := listen(t, "127.0.0.1:0", newRecorder(), nil)
	start := time.Now()
	c, err := Dial(t.Context(), ClientConfig{Addr: s.Addr(), Fingerprint: other.Fingerprint(), Node: "n", Token: testToken})
	if err == nil {
		c.Close()
		t.Fatal("Dial succeeded, want an error")
	}
	t.Log(err)
	if !errors.Is(err, ErrFingerprint) {
		t.Errorf("got %v, want ErrFingerprint", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("Dial took %v, want it to give up at once", took)
	}
	if s.Refused() != 0 {
		t.Errorf("the leader refused %d requests: the follower sent one to a certificate it did not pin", s.Refused())
	}
	// A raw client pinning the other certificate: the handshake fails.
	req, _ := http.NewRequestWithContext(t.Context(), "POST", "https://"+s.Addr()+pathRecs,
		strings.NewReader(string(appendRecords(nil, steps(0, 1, time.Now()), 0))))
	req.Header.Set("Authorization", "Bearer "+testToken)
	req.Header.Set(hdrNode, "n")
	if resp, err := httpClient(t, other).Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("a client pinning another certificate got %d, want a failed handshake", resp.StatusCode)
	} else if !errors.Is(err, ErrFingerprint) {
		t.Errorf("got %v, want ErrFingerprint", err)
	}
	if n := len(rec.records("n")); n != 0 {
		t.Errorf("the handler got %d records", n)
	}
}

// TestNoPlainHTTP: plain HTTP, even with the secret, gets net/http's 400
// for HTTP on an HTTPS port and reaches no Handler; so does a client that
// offers no TLS 1.3.
func TestNoPlainHTTP(t *testing.T) {
	rec := newRecorder()
	s := listen(t, "127.0.0.1:0", rec, nil)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	req, _ := http.NewRequestWithContext(t.Context(), "POST", "http://"+s.Addr()+pathRecs,
		strings.NewReader(string(appendRecords(nil, steps(0, 1, time.Now()), 0))))
	req.Header.Set("Authorization", "Bearer "+testToken)
	req.Header.Set(hdrNode, "n")
	resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "HTTPS") {
		t.Errorf("plain HTTP: got %d %q, want 400 and a word on HTTPS", resp.StatusCode, b)
	}

	old := &tls.Config{InsecureSkipVerify: true, MaxVersion: tls.VersionTLS12} // a client the leader must refuse
	conn, err := tls.Dial("tcp", s.Addr(), old)
	if err == nil {
		conn.Close()
		t.Error("a TLS 1.2 client got a connection, want a failed handshake")
	}
	if n := len(rec.records("n")); n != 0 {
		t.Errorf("the handler got %d records", n)
	}
}

func TestCheckPin(t *testing.T) {
	id, err := newIdentity("10.0.0.1", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	der := id.cert.Certificate[0]
	if err := checkPin(der, id.fingerprint); err != nil {
		t.Errorf("its own fingerprint: %v", err)
	}
	for name, want := range map[string]string{
		"another":   strings.Repeat("0", 64),
		"uppercase": strings.ToUpper(id.fingerprint),
		"empty":     "",
	} {
		if err := checkPin(der, want); !errors.Is(err, ErrFingerprint) {
			t.Errorf("%s: got %v, want ErrFingerprint", name, err)
		}
	}
	if err := checkPin(nil, id.fingerprint); !errors.Is(err, ErrFingerprint) {
		t.Errorf("no certificate: got %v, want ErrFingerprint", err)
	}
	named, err := newIdentity("node-a.cluster", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if named.fingerprint == id.fingerprint {
		t.Error("two identities share a fingerprint")
	}
}
