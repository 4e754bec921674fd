package store

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/ddp-agent/ddp-agent/internal/tempdir"
)

// The job's certificate authority is derived from --rdzv-token alone, so
// every agent of the job holds the same CA key without any exchange, and
// nobody without the token can get a certificate the store accepts. The
// store then requires a certificate signed by it from every client and
// every peer: that is the authentication of every read and write, and of
// the members' raft traffic, at the cost of one TLS handshake per
// connection (etcd's own user auth costs a bcrypt per login and a token
// check per request, and covers clients only).
//
// Ed25519 because its keys come from a seed (ed25519.NewKeyFromSeed) and
// its signatures are deterministic: every agent builds the byte-identical
// CA certificate. The leaves are random keys of each agent's own.

// jobCAVersion is mixed into the derivation; a change of the scheme changes
// it, so agents of two versions fail the handshake instead of half-agreeing.
const jobCAVersion = "ddp-agent etcd job CA v1"

// jobCA returns the job's CA certificate and key for token.
func jobCA(token string) (*x509.Certificate, ed25519.PrivateKey, error) {
	if token == "" {
		return nil, nil, errors.New("job CA: empty token")
	}
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte(jobCAVersion))
	seed := m.Sum(nil)
	key := ed25519.NewKeyFromSeed(seed)
	serial := new(big.Int).SetBytes(seed[:16])
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "ddp-agent job CA"},
		NotBefore:             time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC),
		NotAfter:              time.Date(2120, 1, 1, 0, 0, 0, 0, time.UTC),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	// The reader is unused for Ed25519 (its signatures are deterministic).
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, fmt.Errorf("job CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("job CA: %w", err)
	}
	return cert, key, nil
}

// WriteJobTLS writes, into dir, the job CA's certificate and a fresh
// certificate and key of this agent signed by it, valid for both ends of a
// connection (server and client) and for every name this host answers to,
// and returns them as TLSFiles. dir should be private to the agent.
func WriteJobTLS(dir, token string) (*TLSFiles, error) {
	ca, caKey, err := jobCA(token)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("job TLS key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("job TLS serial: %w", err)
	}
	host, _ := os.Hostname()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "ddp-agent " + host},
		NotBefore:    time.Now().Add(-time.Hour), // clocks of a cluster disagree a little
		NotAfter:     time.Now().AddDate(1, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  localIPs(),
	}
	if host != "" {
		tmpl.DNSNames = append(tmpl.DNSNames, host)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		return nil, fmt.Errorf("job TLS certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("job TLS key: %w", err)
	}
	f := &TLSFiles{
		CertFile: filepath.Join(dir, "agent.pem"),
		KeyFile:  filepath.Join(dir, "agent-key.pem"),
		CAFile:   filepath.Join(dir, "job-ca.pem"),
		// Any certificate of the job's CA proves the token; names would
		// only refuse stores dialled by an alias.
		ChainOnly: true,
	}
	for _, w := range []struct {
		path, kind string
		der        []byte
	}{{f.CAFile, "CERTIFICATE", ca.Raw}, {f.CertFile, "CERTIFICATE", der}, {f.KeyFile, "PRIVATE KEY", keyDER}} {
		if err := os.WriteFile(w.path, pem.EncodeToMemory(&pem.Block{Type: w.kind, Bytes: w.der}), 0o600); err != nil {
			return nil, fmt.Errorf("job TLS: %w", err)
		}
	}
	return f, nil
}

// localIPs is every address of this host's interfaces, loopback included:
// the names a peer or client may dial this agent's member by.
func localIPs() []net.IP {
	ips := []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() {
			ips = append(ips, n.IP)
		}
	}
	return ips
}

// JobTLS is this agent's job certificates, in a private temporary dir that
// Close removes (and that the agent's guard sweeps if the agent is
// SIGKILLed: internal/tempdir).
type JobTLS struct {
	Files *TLSFiles
	dir   *tempdir.Dir
}

// OpenJobTLS writes the job certificates for token (WriteJobTLS) into a
// fresh private dir.
func OpenJobTLS(token string) (*JobTLS, error) {
	dir, err := tempdir.Make("", tempdir.Etcd+"tls-")
	if err != nil {
		return nil, fmt.Errorf("job TLS dir: %w", err)
	}
	files, err := WriteJobTLS(dir.Path, token)
	if err != nil {
		dir.Remove()
		return nil, err
	}
	return &JobTLS{Files: files, dir: dir}, nil
}

// Close removes the files.
func (j *JobTLS) Close() error { return j.dir.Remove() }
