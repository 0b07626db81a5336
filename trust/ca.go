package trust

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/kvwarden/kvwarden/internal/atomicfile"
)

// Validity periods of what `node certs` issues when not told otherwise.
const (
	DefaultCAValidFor   = 5 * 365 * 24 * time.Hour
	DefaultCertValidFor = 365 * 24 * time.Hour
)

// File names inside a credentials directory.
const (
	CACertFile  = "ca.crt"
	CAKeyFile   = "ca.key"
	GossipFile  = "gossip.keys"
	certSuffix  = ".crt"
	keySuffix   = ".key"
	dirMode     = 0o700
	publicMode  = 0o644
	privateMode = 0o600
)

// CA is a cluster's certificate authority: it issues every node's,
// operator's and tenant's certificate.
type CA struct {
	Cluster string
	Cert    *x509.Certificate
	key     *ecdsa.PrivateKey
}

// NewCA makes a CA for cluster, valid from now for validFor.
func NewCA(cluster string, validFor time.Duration, now time.Time) (*CA, error) {
	if err := checkName("cluster", cluster); err != nil {
		return nil, err
	}
	if validFor <= 0 {
		return nil, fmt.Errorf("trust: CA validity (%s) must be positive", validFor)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("trust: CA key: %w", err)
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, err
	}
	uri, _ := url.Parse(Scheme + "://" + cluster)
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "kvwarden CA " + cluster, Organization: []string{"kvwarden"}},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(validFor),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
		URIs:                  []*url.URL{uri},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("trust: CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cluster: cluster, Cert: cert, key: key}, nil
}

func serialNumber() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("trust: serial number: %w", err)
	}
	return n.Add(n, big.NewInt(1)), nil
}

// Issued is a certificate and its private key, PEM-encoded.
type Issued struct {
	Identity Identity
	CertPEM  []byte
	KeyPEM   []byte
}

// Issue makes a certificate for id, whose cluster must be the CA's. hosts
// (IP addresses or DNS names) go into its SANs for tools that check them;
// kvwarden itself checks the identity, and binds addresses by who answers
// at them. The certificate serves both ends of a TLS connection: every
// node and client both dials and serves.
func (ca *CA) Issue(id Identity, hosts []string, validFor time.Duration, now time.Time) (Issued, error) {
	if err := id.Validate(); err != nil {
		return Issued{}, err
	}
	if id.Cluster != ca.Cluster {
		return Issued{}, fmt.Errorf("trust: identity %s is of cluster %q, the CA's is %q", id, id.Cluster, ca.Cluster)
	}
	if validFor <= 0 {
		return Issued{}, fmt.Errorf("trust: certificate validity (%s) must be positive", validFor)
	}
	if end := now.Add(validFor); end.After(ca.Cert.NotAfter) {
		return Issued{}, fmt.Errorf("trust: certificate would end %s, after the CA (%s)", end.Format(time.RFC3339),
			ca.Cert.NotAfter.Format(time.RFC3339))
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Issued{}, fmt.Errorf("trust: key: %w", err)
	}
	serial, err := serialNumber()
	if err != nil {
		return Issued{}, err
	}
	uri, err := url.Parse(id.URI())
	if err != nil {
		return Issued{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: string(id.Role) + "/" + id.Name, Organization: []string{"kvwarden " + id.Cluster}},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(validFor),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{uri},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		return Issued{}, fmt.Errorf("trust: certificate for %s: %w", id, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Issued{}, err
	}
	return Issued{Identity: id, CertPEM: pemBlock("CERTIFICATE", der), KeyPEM: pemBlock("PRIVATE KEY", keyDER)}, nil
}

// Bundle issues a certificate for id and assembles it into a Bundle with
// this CA, for processes that make their credentials themselves (tests,
// a throwaway local cluster).
func (ca *CA) Bundle(id Identity, hosts []string, validFor time.Duration, now time.Time, gossipKeys [][]byte) (*Bundle, error) {
	is, err := ca.Issue(id, hosts, validFor, now)
	if err != nil {
		return nil, err
	}
	return NewBundle(ca.Cert, is.CertPEM, is.KeyPEM, gossipKeys)
}

func pemBlock(kind string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der})
}

// FileName is the base name (without .crt/.key) of an identity's files in
// a credentials directory: <role>-<name>.
func FileName(id Identity) string { return string(id.Role) + "-" + id.Name }

// WriteCA writes the CA's certificate and key into dir (made 0700 if
// missing) and a fresh gossip key. It refuses to overwrite an existing CA:
// every certificate it issued would be orphaned.
func (ca *CA) WriteCA(dir string) error {
	if err := os.MkdirAll(dir, dirMode); err != nil {
		return fmt.Errorf("trust: credentials directory: %w", err)
	}
	if _, err := os.Stat(filepath.Join(dir, CACertFile)); err == nil {
		return fmt.Errorf("trust: %s already holds a CA (%s); remove it first to make a new one", dir, CACertFile)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(ca.key)
	if err != nil {
		return err
	}
	gossip, err := NewGossipKey()
	if err != nil {
		return err
	}
	return errors.Join(
		writeFile(filepath.Join(dir, CAKeyFile), pemBlock("PRIVATE KEY", keyDER), privateMode),
		writeFile(filepath.Join(dir, CACertFile), pemBlock("CERTIFICATE", ca.Cert.Raw), publicMode),
		writeFile(filepath.Join(dir, GossipFile), EncodeGossipKeys([][]byte{gossip}), privateMode))
}

// Write puts the certificate and its key into dir as <role>-<name>.crt
// and .key (0600).
func (is Issued) Write(dir string) error {
	if err := os.MkdirAll(dir, dirMode); err != nil {
		return fmt.Errorf("trust: credentials directory: %w", err)
	}
	base := filepath.Join(dir, FileName(is.Identity))
	return errors.Join(writeFile(base+keySuffix, is.KeyPEM, privateMode), writeFile(base+certSuffix, is.CertPEM, publicMode))
}

// writeFile writes atomically (temporary file, then rename) with mode.
func writeFile(path string, data []byte, mode os.FileMode) error {
	if err := atomicfile.Write(path, data, mode); err != nil {
		return fmt.Errorf("trust: writing %s: %w", path, err)
	}
	return nil
}

// LoadCA reads a CA written by WriteCA, to issue more certificates.
func LoadCA(dir string) (*CA, error) {
	cert, err := readCert(filepath.Join(dir, CACertFile))
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, CAKeyFile))
	if err != nil {
		return nil, fmt.Errorf("trust: CA key: %w", err)
	}
	b, _ := pem.Decode(keyPEM)
	if b == nil {
		return nil, fmt.Errorf("trust: %s holds no PEM block", filepath.Join(dir, CAKeyFile))
	}
	k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("trust: CA key: %w", err)
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("trust: CA key is %T, want ECDSA", k)
	}
	cluster, err := caCluster(cert)
	if err != nil {
		return nil, err
	}
	return &CA{Cluster: cluster, Cert: cert, key: key}, nil
}

// caCluster is the cluster a CA certificate names in its URI SAN.
func caCluster(cert *x509.Certificate) (string, error) {
	for _, u := range cert.URIs {
		if u.Scheme == Scheme && u.Path == "" {
			if err := checkName("cluster", u.Host); err != nil {
				return "", err
			}
			return u.Host, nil
		}
	}
	return "", fmt.Errorf("trust: CA certificate %q names no %s://<cluster>", cert.Subject.CommonName, Scheme)
}

func readCert(path string) (*x509.Certificate, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("trust: certificate: %w", err)
	}
	b, _ := pem.Decode(data)
	if b == nil || b.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("trust: %s holds no PEM certificate", path)
	}
	cert, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("trust: %s: %w", path, err)
	}
	return cert, nil
}

// Fingerprint is the SHA-256 of a certificate's DER bytes.
func Fingerprint(cert *x509.Certificate) [32]byte { return sha256.Sum256(cert.Raw) }
