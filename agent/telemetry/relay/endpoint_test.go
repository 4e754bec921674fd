package relay

import (
	"strings"
	"testing"
)

var (
	testFP     = strings.Repeat("ab", 32)
	testSecret = strings.Repeat("5e", 32)
)

func TestEndpointRoundTrip(t *testing.T) {
	for _, e := range []Endpoint{
		{Addr: "10.0.0.1:41234", Fingerprint: testFP, Secret: testSecret},
		{Addr: "10.0.0.1:41234", Fingerprint: testFP}, // --rdzv-token: no secret
		{Addr: "[fd00::2]:1", Fingerprint: testFP},
		{Addr: "node-a.cluster:65535", Fingerprint: testFP},
	} {
		b, err := e.Encode()
		if err != nil {
			t.Fatalf("%+v: %v", e, err)
		}
		if len(b) > maxEndpoint {
			t.Errorf("%s: %d bytes, over %d", b, len(b), maxEndpoint)
		}
		if e.Secret == "" && strings.Contains(string(b), "secret") {
			t.Errorf("%s: a secret field without a secret", b)
		}
		got, err := DecodeEndpoint(b)
		if err != nil || got != e {
			t.Errorf("%s: decoded %+v, %v; want %+v", b, got, err, e)
		}
	}
	// The form other agents of this version read.
	b, _ := Endpoint{Addr: "10.0.0.1:41234", Fingerprint: testFP, Secret: testSecret}.Encode()
	if want := `{"addr":"10.0.0.1:41234","fingerprint":"` + testFP + `","secret":"` + testSecret + `"}`; string(b) != want {
		t.Errorf("encoded %s, want %s", b, want)
	}
}

func malformedEndpoints() map[string]string {
	ok := func(addr, fp, secret string) string {
		return `{"addr":"` + addr + `","fingerprint":"` + fp + `","secret":"` + secret + `"}`
	}
	return map[string]string{
		"empty":                 ``,
		"an older leader's":     `10.0.0.1:41234`,
		"null":                  `null`,
		"an array":              `[]`,
		"cut short":             `{"addr":"10.0.0.1:1"`,
		"no addr":               `{"fingerprint":"` + testFP + `"}`,
		"no fingerprint":        `{"addr":"10.0.0.1:1"}`,
		"unknown field":         `{"addr":"10.0.0.1:1","fingerprint":"` + testFP + `","token":"x"}`,
		"trailing data":         ok("10.0.0.1:1", testFP, testSecret) + ` {}`,
		"two values":            ok("10.0.0.1:1", testFP, testSecret) + ok("10.0.0.1:1", testFP, testSecret),
		"addr without port":     ok("10.0.0.1", testFP, testSecret),
		"port 0":                ok("10.0.0.1:0", testFP, testSecret),
		"port too big":          ok("10.0.0.1:65536", testFP, testSecret),
		"port a name":           ok("10.0.0.1:http", testFP, testSecret),
		"no host":               ok(":41234", testFP, testSecret),
		"every interface":       ok("0.0.0.0:41234", testFP, testSecret),
		"every IPv6 interface":  ok("[::]:41234", testFP, testSecret),
		"multicast":             ok("224.0.0.1:41234", testFP, testSecret),
		"host with a space":     ok("node a:41234", testFP, testSecret),
		"host with a slash":     ok("node/a:41234", testFP, testSecret),
		"host too long":         ok(strings.Repeat("a", maxHostName+1)+":1", testFP, testSecret),
		"short fingerprint":     ok("10.0.0.1:1", testFP[:62], testSecret),
		"uppercase fingerprint": ok("10.0.0.1:1", strings.ToUpper(testFP), testSecret),
		"fingerprint not hex":   ok("10.0.0.1:1", strings.Repeat("zz", 32), testSecret),
		"short secret":          ok("10.0.0.1:1", testFP, testSecret[:32]),
		"secret not hex":        ok("10.0.0.1:1", testFP, strings.Repeat("g", 64)),
		"fingerprint a number":  `{"addr":"10.0.0.1:1","fingerprint":7}`,
		"too large":             `{"addr":"10.0.0.1:1","fingerprint":"` + testFP + `"}` + strings.Repeat(" ", maxEndpoint),
	}
}

func TestDecodeEndpointMalformed(t *testing.T) {
	for name, v := range malformedEndpoints() {
		t.Run(name, func(t *testing.T) {
			e, err := DecodeEndpoint([]byte(v))
			if err == nil {
				t.Fatalf("decoded %+v, want an error", e)
			}
			t.Log(err)
			if strings.Contains(err.Error(), testSecret) {
				t.Errorf("the error shows the secret: %v", err)
			}
		})
	}
	if _, err := (Endpoint{Addr: "0.0.0.0:1", Fingerprint: testFP}).Encode(); err == nil {
		t.Error("Encode accepted an endpoint on every interface")
	}
}

// FuzzDecodeEndpoint: whatever decodes is valid and encodes back to an
// endpoint that decodes the same.
func FuzzDecodeEndpoint(f *testing.F) {
	b, _ := Endpoint{Addr: "10.0.0.1:41234", Fingerprint: testFP, Secret: testSecret}.Encode()
	f.Add(b)
	for _, v := range malformedEndpoints() {
		f.Add([]byte(v))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := DecodeEndpoint(b)
		if err != nil {
			return
		}
		if err := e.Validate(); err != nil {
			t.Fatalf("decoded an invalid endpoint %+v: %v", e, err)
		}
		again, err := e.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if e2, err := DecodeEndpoint(again); err != nil || e2 != e {
			t.Fatalf("round trip: %+v, %v; want %+v", e2, err, e)
		}
	})
}

// TestTokens: with --rdzv-token the secret is derived and never
// published; without, it is random per leader and published, and the
// follower takes it from the endpoint.
func TestTokens(t *testing.T) {
	tok, publish := LeaderToken("job", "s3cret")
	if tok != JobToken("job", "s3cret") || publish {
		t.Errorf("with --rdzv-token: %q, publish %v; want JobToken, not published", tok, publish)
	}
	a, pa := LeaderToken("job", "")
	b, _ := LeaderToken("job", "")
	if !pa || !isHex(a, 64) || a == b || a == JobToken("job", "") {
		t.Errorf("without --rdzv-token: %q then %q, publish %v; want random 256-bit hex, published", a, b, pa)
	}
	e := Endpoint{Addr: "10.0.0.1:1", Fingerprint: testFP, Secret: a}
	if got, err := FollowerToken(e, "job", ""); got != a || err != nil {
		t.Errorf("follower without --rdzv-token: %q, %v; want the published secret", got, err)
	}
	if got, err := FollowerToken(Endpoint{Addr: e.Addr, Fingerprint: testFP}, "job", "s3cret"); got != tok || err != nil {
		t.Errorf("follower with --rdzv-token: %q, %v; want JobToken", got, err)
	}
	if _, err := FollowerToken(Endpoint{Addr: e.Addr, Fingerprint: testFP}, "job", ""); err == nil {
		t.Error("follower with neither a token nor a published secret: no error")
	}
}
