// Package storetest makes what tests of the rendezvous store need and the
// standard library does not have at hand: a throwaway PKI.
package storetest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// PKI is a CA with a server and a client certificate for 127.0.0.1 and
// localhost, valid for an hour, written as PEM files.
type PKI struct {
	CAFile, ServerCert, ServerKey, ClientCert, ClientKey string
}

// NewPKI writes a fresh PKI into dir.
func NewPKI(dir string) (PKI, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return PKI{}, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "ddp-agent test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return PKI{}, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return PKI{}, err
	}
	p := PKI{CAFile: filepath.Join(dir, "ca.pem")}
	if err := writePEM(p.CAFile, "CERTIFICATE", caDER); err != nil {
		return PKI{}, err
	}
	leaf := func(serial int64, name string, usage []x509.ExtKeyUsage) (certFile, keyFile string, err error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return "", "", err
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: name},
			NotBefore:    time.Now().Add(-time.Hour),
			NotAfter:     time.Now().Add(time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  usage,
			IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
			DNSNames:     []string{"localhost"},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return "", "", err
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return "", "", err
		}
		certFile = filepath.Join(dir, name+".pem")
		keyFile = filepath.Join(dir, name+"-key.pem")
		if err := writePEM(certFile, "CERTIFICATE", der); err != nil {
			return "", "", err
		}
		return certFile, keyFile, writePEM(keyFile, "EC PRIVATE KEY", keyDER)
	}
	// etcd may use the server certificate as a client one too (its gRPC
	// gateway dials itself), so it gets both usages.
	if p.ServerCert, p.ServerKey, err = leaf(2, "server", []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}); err != nil {
		return PKI{}, fmt.Errorf("server certificate: %w", err)
	}
	if p.ClientCert, p.ClientKey, err = leaf(3, "client", []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}); err != nil {
		return PKI{}, fmt.Errorf("client certificate: %w", err)
	}
	return p, nil
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}
