package relay

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
)

// Endpoint is what the leader publishes in the job's store, one JSON
// value under one key, for its followers to reach it:
//
//	{"addr": "10.0.0.1:41234", "fingerprint": "<64 hex>", "secret": "<64 hex>"}
//
// The secret is there only when the job has no --rdzv-token (see
// LeaderToken). Whoever can read the store can read it: the store is the
// job's trust root, as whoever can write it can disrupt the job anyway.
type Endpoint struct {
	Addr        string `json:"addr"`             // host:port the Server listens on, the host an IP address
	Fingerprint string `json:"fingerprint"`      // hex SHA-256 of its certificate (DER), lowercase
	Secret      string `json:"secret,omitempty"` // the token followers present, hex; "" with --rdzv-token
}

// maxEndpoint bounds a published Endpoint: its fields are an address and
// two 64-digit hex strings.
const maxEndpoint = 1024

// maxHostName is the longest DNS name.
const maxHostName = 253

// Validate checks e as a follower must before it dials: a host and a
// port, a fingerprint and a secret of the right form.
func (e Endpoint) Validate() error {
	host, port, err := net.SplitHostPort(e.Addr)
	if err != nil {
		return fmt.Errorf("addr %q: %w", e.Addr, err)
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
		return fmt.Errorf("addr %q: port %q is not 1 to 65535", e.Addr, port)
	}
	if err := validHost(host); err != nil {
		return fmt.Errorf("addr %q: %w", e.Addr, err)
	}
	if !isHex(e.Fingerprint, 2*32) {
		return fmt.Errorf("fingerprint %q: want 64 lowercase hex digits (SHA-256)", e.Fingerprint)
	}
	if e.Secret != "" && !isHex(e.Secret, 2*secretSize) {
		return errors.New("secret: want 64 lowercase hex digits, or none") // the value stays out of logs
	}
	return nil
}

// validHost accepts an IP address other than an unspecified or multicast
// one, or something that can be a host name.
func validHost(host string) error {
	if ip := net.ParseIP(host); ip != nil {
		if ip.IsUnspecified() || ip.IsMulticast() {
			return fmt.Errorf("host %s: not the address of one host", host)
		}
		return nil
	}
	if host == "" || len(host) > maxHostName {
		return fmt.Errorf("host %q: want 1 to %d bytes", host, maxHostName)
	}
	for i := range len(host) {
		c := host[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_') {
			return fmt.Errorf("host %q: not a host name", host)
		}
	}
	return nil
}

func isHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := range len(s) {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// Encode is e as published, after Validate.
func (e Endpoint) Encode() ([]byte, error) {
	if err := e.Validate(); err != nil {
		return nil, fmt.Errorf("relay: endpoint: %w", err)
	}
	return json.Marshal(e)
}

// DecodeEndpoint parses and validates a published Endpoint: one JSON
// object of known fields, at most 1 KiB. Anything else, an older agent's
// bare "host:port" included, is an error that says so.
func DecodeEndpoint(b []byte) (Endpoint, error) {
	if len(b) > maxEndpoint {
		return Endpoint{}, fmt.Errorf("relay: endpoint of %d bytes: over the limit of %d", len(b), maxEndpoint)
	}
	if t := bytes.TrimSpace(b); len(t) == 0 || t[0] != '{' {
		return Endpoint{}, fmt.Errorf("relay: endpoint %q: not a JSON object (a leader of an older ddp-agent?)", b[:min(len(b), 80)])
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var e Endpoint
	if err := dec.Decode(&e); err != nil {
		return Endpoint{}, fmt.Errorf("relay: endpoint: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Endpoint{}, errors.New("relay: endpoint: data after the JSON object")
	}
	if err := e.Validate(); err != nil {
		return Endpoint{}, fmt.Errorf("relay: endpoint: %w", err)
	}
	return e, nil
}
