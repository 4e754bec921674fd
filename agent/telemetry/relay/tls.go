package relay

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"fmt"
	"math/big"
	"net"
	"time"
)

// identity is a Server's TLS certificate and its fingerprint, the hex
// SHA-256 of the certificate's DER: what the followers pin.
type identity struct {
	cert        tls.Certificate
	fingerprint string
}

// certValidity spans any plausible life of the process: the certificate
// is made when the Server starts, lives in memory only and dies with the
// Server, and the followers pin it by fingerprint, so its dates protect
// nothing; they only need to satisfy tools that look.
const certValidity = 10 * 365 * 24 * time.Hour

// newIdentity makes a self-signed ECDSA P-256 certificate for host (an IP
// address or a name, its subject alternative name) valid from an hour
// before now (the followers' clocks may be behind).
func newIdentity(host string, now time.Time) (identity, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return identity{}, fmt.Errorf("relay: certificate key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return identity{}, fmt.Errorf("relay: certificate serial: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "ddp-agent relay " + host},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(certValidity),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	if ip := net.ParseIP(host); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	} else {
		tmpl.DNSNames = []string{host}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return identity{}, fmt.Errorf("relay: self-signed certificate for %s: %w", host, err)
	}
	return identity{cert: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, fingerprint: fingerprint(der)}, nil
}

// fingerprint is the hex SHA-256 of a certificate's DER.
func fingerprint(der []byte) string {
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:])
}

// serverTLS is the Server's TLS configuration: TLS 1.3, HTTP/1.1.
func serverTLS(id identity) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{id.cert},
		NextProtos:   []string{"http/1.1"},
	}
}

// pinnedTLS is a follower's TLS configuration: it trusts exactly the
// certificate whose fingerprint the leader published. The usual chain and
// name checks are off (the certificate is self-signed and the store is the
// trust root); checkPin replaces them, in VerifyConnection, which, unlike
// VerifyPeerCertificate, runs on resumed sessions too.
func pinnedTLS(want string) *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		NextProtos:         []string{"http/1.1"},
		InsecureSkipVerify: true, // replaced by the pin below
		VerifyConnection: func(cs tls.ConnectionState) error {
			var leaf []byte
			if len(cs.PeerCertificates) > 0 {
				leaf = cs.PeerCertificates[0].Raw
			}
			return checkPin(leaf, want)
		},
	}
}

// checkPin accepts the leader's certificate (DER) only when it has the
// published fingerprint.
func checkPin(der []byte, want string) error {
	if der == nil {
		return fmt.Errorf("%w: the leader sent no certificate", ErrFingerprint)
	}
	if got := fingerprint(der); got != want {
		return fmt.Errorf("%w: got sha256 %s, want %s", ErrFingerprint, got, want)
	}
	return nil
}
