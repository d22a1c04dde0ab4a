// Package selfsigned writes a self-signed TLS certificate for a loopback
// server, so that tests and the bench can run an S3 server over https as
// production does, and the client trusts exactly that certificate (never
// by turning verification off).
package selfsigned

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

// Cert is a certificate and key written by Write.
type Cert struct {
	// CertFile and KeyFile are PEM files; CertFile is also the CA bundle a
	// client trusts (SSL_CERT_FILE), since the certificate signs itself.
	CertFile, KeyFile string
	// Pool holds the certificate alone.
	Pool *x509.CertPool
}

// Write makes a certificate for 127.0.0.1, ::1, localhost and names (the
// public names a test's proxy serves, reached on loopback), valid from an
// hour ago for a day, and writes it and its key (0600) into dir.
func Write(dir string, names ...string) (Cert, error) {
	return WriteFor(dir, append([]string{"localhost"}, names...)...)
}

// WriteFor is Write for 127.0.0.1, ::1 and the DNS names given alone: the
// name a client verifies, such as a Kubernetes Service's
// (name.namespace.svc) that the API server dials an aggregated API by.
func WriteFor(dir string, dnsNames ...string) (Cert, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Cert{}, fmt.Errorf("selfsigned: key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return Cert{}, fmt.Errorf("selfsigned: serial: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "vmshelf loopback test server"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		DNSNames:              dnsNames,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return Cert{}, fmt.Errorf("selfsigned: certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return Cert{}, fmt.Errorf("selfsigned: certificate: %w", err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Cert{}, fmt.Errorf("selfsigned: key: %w", err)
	}
	c := Cert{CertFile: filepath.Join(dir, "cert.pem"), KeyFile: filepath.Join(dir, "key.pem"), Pool: x509.NewCertPool()}
	c.Pool.AddCert(leaf)
	if err := os.WriteFile(c.CertFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return Cert{}, fmt.Errorf("selfsigned: %w", err)
	}
	if err := os.WriteFile(c.KeyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return Cert{}, fmt.Errorf("selfsigned: %w", err)
	}
	return c, nil
}
