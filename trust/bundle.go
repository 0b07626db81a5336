package trust

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Bundle is what one node, operator or client needs to take part: its
// own certificate and key, the cluster CA that every peer's certificate
// must chain to, and (for nodes) the gossip keyring.
type Bundle struct {
	Self       Identity
	Cert       tls.Certificate
	Leaf       *x509.Certificate
	CA         *x509.Certificate
	roots      *x509.CertPool
	GossipKeys [][]byte // nil when the bundle holds none
}

// NewBundle assembles a bundle from PEM-encoded parts; gossipKeys may be
// nil.
func NewBundle(caCert *x509.Certificate, certPEM, keyPEM []byte, gossipKeys [][]byte) (*Bundle, error) {
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("trust: key pair: %w", err)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return nil, err
	}
	cert.Leaf = leaf
	cluster, err := caCluster(caCert)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	roots.AddCert(caCert)
	b := &Bundle{Cert: cert, Leaf: leaf, CA: caCert, roots: roots, GossipKeys: gossipKeys}
	if b.Self, err = b.verify(leaf, nil, x509.ExtKeyUsageClientAuth); err != nil {
		return nil, fmt.Errorf("trust: own certificate: %w", err)
	}
	if b.Self.Cluster != cluster {
		return nil, fmt.Errorf("trust: own certificate is of cluster %q, the CA's is %q", b.Self.Cluster, cluster)
	}
	return b, nil
}

// LoadFiles reads dir's CA certificate, the certificate and key named base
// (base.crt, base.key; FileName gives an identity's) and, if present, the
// gossip keyring.
func LoadFiles(dir, base string) (*Bundle, error) {
	ca, err := readCert(filepath.Join(dir, CACertFile))
	if err != nil {
		return nil, err
	}
	certPEM, err := os.ReadFile(filepath.Join(dir, base+certSuffix))
	if err != nil {
		return nil, fmt.Errorf("trust: certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, base+keySuffix))
	if err != nil {
		return nil, fmt.Errorf("trust: key: %w", err)
	}
	var gossip [][]byte
	if _, err := os.Stat(filepath.Join(dir, GossipFile)); err == nil {
		if gossip, err = LoadGossipKeys(dir); err != nil {
			return nil, err
		}
	}
	return NewBundle(ca, certPEM, keyPEM, gossip)
}

// ErrNotAuthenticated matches every refusal of a peer's certificate.
var ErrNotAuthenticated = errors.New("trust: peer not authenticated")

// CertError is a peer certificate refused, with why.
type CertError struct {
	Subject string
	Reason  string
}

func (e *CertError) Error() string {
	return fmt.Sprintf("trust: certificate %q refused: %s", e.Subject, e.Reason)
}

func (e *CertError) Is(target error) bool { return target == ErrNotAuthenticated }

// verify checks that leaf chains to the cluster CA for usage and names
// exactly one identity of this cluster, and returns it.
func (b *Bundle) verify(leaf *x509.Certificate, intermediates []*x509.Certificate, usage x509.ExtKeyUsage) (Identity, error) {
	pool := x509.NewCertPool()
	for _, c := range intermediates {
		pool.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: b.roots, Intermediates: pool, CurrentTime: time.Now(),
		KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return Identity{}, &CertError{Subject: leaf.Subject.CommonName, Reason: err.Error()}
	}
	var ids []Identity
	for _, u := range leaf.URIs {
		if u.Scheme != Scheme {
			continue
		}
		id, err := ParseIdentity(u)
		if err != nil {
			return Identity{}, &CertError{Subject: leaf.Subject.CommonName, Reason: err.Error()}
		}
		ids = append(ids, id)
	}
	if len(ids) != 1 {
		return Identity{}, &CertError{Subject: leaf.Subject.CommonName,
			Reason: fmt.Sprintf("names %d %s identities, want 1", len(ids), Scheme)}
	}
	if b.Self.Cluster != "" && ids[0].Cluster != b.Self.Cluster {
		return Identity{}, &CertError{Subject: leaf.Subject.CommonName,
			Reason: fmt.Sprintf("cluster %q, this is %q", ids[0].Cluster, b.Self.Cluster)}
	}
	return ids[0], nil
}

// PeerIdentity is the verified identity of the other end of a TLS
// connection configured by ServerTLS or ClientTLS.
func (b *Bundle) PeerIdentity(cs tls.ConnectionState, usage x509.ExtKeyUsage) (Identity, *x509.Certificate, error) {
	if len(cs.PeerCertificates) == 0 {
		return Identity{}, nil, &CertError{Reason: "no certificate presented"}
	}
	leaf := cs.PeerCertificates[0]
	id, err := b.verify(leaf, cs.PeerCertificates[1:], usage)
	return id, leaf, err
}

// ServerTLS is the configuration of every listening side: TLS 1.3, a
// client certificate of this cluster required.
func (b *Bundle) ServerTLS() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{b.Cert},
		ClientAuth:   tls.RequireAnyClientCert,
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, _, err := b.PeerIdentity(cs, x509.ExtKeyUsageClientAuth)
			return err
		},
	}
}

// ClientTLS is the configuration of every dialing side: TLS 1.3, the
// server's certificate must chain to the cluster CA and name an identity
// of this cluster. Host names are not checked: addresses move (port 0,
// containers), and what a certificate proves is checked against the
// identity the caller expects at that address (Peers).
func (b *Bundle) ClientTLS() *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		Certificates:       []tls.Certificate{b.Cert},
		InsecureSkipVerify: true, // replaced by VerifyConnection, which checks chain and identity
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, _, err := b.PeerIdentity(cs, x509.ExtKeyUsageServerAuth)
			return err
		},
	}
}
