package trust_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/trust"
)

func newCA(t *testing.T, cluster string) *trust.CA {
	t.Helper()
	ca, err := trust.NewCA(cluster, 24*time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

// What `node certs` writes, a node reads back: the CA, its gossip key and
// an issued certificate, with private files readable by the owner only.
func TestCredentialsDirectoryRoundTrip(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "creds")
	ca := newCA(t, "c1")
	if err := ca.WriteCA(dir); err != nil {
		t.Fatal(err)
	}
	id := trust.Identity{Cluster: "c1", Role: trust.RoleDecode, Name: "d0"}
	is, err := ca.Issue(id, []string{"127.0.0.1", "decode-0.local"}, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := is.Write(dir); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]os.FileMode{
		"":               0o700,
		trust.CAKeyFile:  0o600,
		trust.GossipFile: 0o600,
		trust.CACertFile: 0o644,
		"decode-d0.key":  0o600,
		"decode-d0.crt":  0o644,
	} {
		if got := mode(t, filepath.Join(dir, name)); got != want {
			t.Errorf("%s: mode %#o, want %#o", filepath.Join(dir, name), got, want)
		}
	}
	b, err := trust.LoadFiles(dir, trust.FileName(id))
	if err != nil {
		t.Fatal(err)
	}
	if b.Self != id || !b.CA.Equal(ca.Cert) {
		t.Fatalf("loaded bundle of %s with CA %q, want %s with %q", b.Self, b.CA.Subject, id, ca.Cert.Subject)
	}
	if len(b.GossipKeys) != 1 || len(b.GossipKeys[0]) != trust.GossipKeyBytes {
		t.Fatalf("loaded %d gossip keys, want one of %d bytes", len(b.GossipKeys), trust.GossipKeyBytes)
	}
	if b.Leaf.IPAddresses[0].String() != "127.0.0.1" || b.Leaf.DNSNames[0] != "decode-0.local" {
		t.Fatalf("SANs %v %v, want the hosts given", b.Leaf.IPAddresses, b.Leaf.DNSNames)
	}

	// A CA read back issues certificates that the first one's bundles accept.
	again, err := trust.LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	tenant, err := again.Bundle(trust.Identity{Cluster: "c1", Role: trust.RoleTenant, Name: "acme"}, nil, time.Hour,
		time.Now(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !tenant.CA.Equal(b.CA) {
		t.Fatal("the CA read back is another CA")
	}
	handshake(t, b, tenant)

	// A second CA in the same directory would orphan every certificate.
	before, err := os.ReadFile(filepath.Join(dir, trust.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	err = newCA(t, "c1").WriteCA(dir)
	if err == nil || !strings.Contains(err.Error(), "already holds a CA") {
		t.Fatalf("second WriteCA = %v, want a refusal", err)
	}
	if after, _ := os.ReadFile(filepath.Join(dir, trust.CACertFile)); !bytes.Equal(before, after) {
		t.Fatal("the refused WriteCA changed ca.crt")
	}
}

func TestIssueRefusals(t *testing.T) {
	ca := newCA(t, "c1")
	now := time.Now()
	tests := []struct {
		name     string
		id       trust.Identity
		validFor time.Duration
		want     string
	}{
		{"other cluster", trust.Identity{Cluster: "c2", Role: trust.RoleDecode, Name: "d0"}, time.Hour,
			`is of cluster "c2", the CA's is "c1"`},
		{"bad name", trust.Identity{Cluster: "c1", Role: trust.RoleTenant, Name: "a/b"}, time.Hour, "has '/' at byte 1"},
		{"bad role", trust.Identity{Cluster: "c1", Role: "root", Name: "r"}, time.Hour, `unknown role "root"`},
		{"no validity", trust.Identity{Cluster: "c1", Role: trust.RoleDecode, Name: "d0"}, 0, "validity (0s) must be positive"},
		{"outlives the CA", trust.Identity{Cluster: "c1", Role: trust.RoleDecode, Name: "d0"}, 48 * time.Hour, "after the CA"},
	}
	for _, tt := range tests {
		if _, err := ca.Issue(tt.id, nil, tt.validFor, now); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: Issue = %v, want an error saying %q", tt.name, err, tt.want)
		}
	}
	if _, err := trust.NewCA("no spaces", time.Hour, now); err == nil || !strings.Contains(err.Error(), "has ' ' at byte 2") {
		t.Errorf("NewCA(no spaces) = %v", err)
	}
	if _, err := trust.NewCA("c1", -time.Hour, now); err == nil || !strings.Contains(err.Error(), "(-1h0m0s) must be positive") {
		t.Errorf("NewCA(negative validity) = %v", err)
	}
}

// caKey reads the CA's private key back from what WriteCA wrote, to sign
// what the CA itself would refuse to issue.
func caKey(t *testing.T, ca *trust.CA) *ecdsa.PrivateKey {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "ca")
	if err := ca.WriteCA(dir); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, trust.CAKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(data)
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return k.(*ecdsa.PrivateKey)
}

// forge signs with ca's key a certificate naming uris, as a careless or
// malicious issuer with the key would.
func forge(t *testing.T, ca *trust.CA, uris ...string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	var us []*url.URL
	for _, uri := range uris {
		u, err := url.Parse(uri)
		if err != nil {
			t.Fatal(err)
		}
		us = append(us, u)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "forged"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, URIs: us}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, caKey(t, ca))
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})
}

func TestNewBundleRefusals(t *testing.T) {
	ca, other := newCA(t, "c1"), newCA(t, "c2")
	is, err := other.Issue(trust.Identity{Cluster: "c2", Role: trust.RoleDecode, Name: "d0"}, nil, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	// Another cluster's certificate does not chain to this CA.
	_, err = trust.NewBundle(ca.Cert, is.CertPEM, is.KeyPEM, nil)
	var ce *trust.CertError
	if !errors.As(err, &ce) || !strings.Contains(ce.Reason, "unknown authority") {
		t.Fatalf("NewBundle(another CA's certificate) = %v, want a CertError", err)
	}
	// Signed by this CA but naming another cluster.
	certPEM, keyPEM := forge(t, ca, "kvwarden://c2/decode/d0")
	if _, err := trust.NewBundle(ca.Cert, certPEM, keyPEM, nil); err == nil ||
		!strings.Contains(err.Error(), `own certificate is of cluster "c2", the CA's is "c1"`) {
		t.Fatalf("NewBundle(certificate of cluster c2 from CA c1) = %v", err)
	}
	// A certificate must name exactly one identity: which would two be?
	for n, uris := range [][]string{{"https://example.com"}, {"kvwarden://c1/decode/d0", "kvwarden://c1/tenant/t"}} {
		certPEM, keyPEM = forge(t, ca, uris...)
		_, err := trust.NewBundle(ca.Cert, certPEM, keyPEM, nil)
		if want := fmt.Sprintf("names %d kvwarden identities, want 1", n*2); !errors.As(err, &ce) ||
			!strings.Contains(ce.Reason, want) {
			t.Fatalf("NewBundle(certificate naming %v) = %v, want %q", uris, err, want)
		}
	}
	// A key that is not the certificate's.
	_, wrongKey := forge(t, ca, "kvwarden://c1/decode/d0")
	if _, err := trust.NewBundle(ca.Cert, is.CertPEM, wrongKey, nil); err == nil || !strings.Contains(err.Error(), "key pair") {
		t.Fatalf("NewBundle(mismatched key) = %v", err)
	}
	// An expired certificate is refused at load, before it is presented.
	old, err := ca.Issue(trust.Identity{Cluster: "c1", Role: trust.RoleDecode, Name: "d0"}, nil, time.Hour,
		time.Now().Add(-2*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := trust.NewBundle(ca.Cert, old.CertPEM, old.KeyPEM, nil); !errors.As(err, &ce) ||
		!strings.Contains(ce.Reason, "expired") {
		t.Fatalf("NewBundle(expired) = %v, want a CertError saying expired", err)
	}
}

func TestLoadFilesMissing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "creds")
	ca := newCA(t, "c1")
	if _, err := trust.LoadFiles(dir, "decode-d0"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("LoadFiles(empty) = %v", err)
	}
	if err := ca.WriteCA(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := trust.LoadFiles(dir, "decode-d0"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("LoadFiles(no certificate) = %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, trust.GossipFile), []byte("not base64!\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	is, err := ca.Issue(trust.Identity{Cluster: "c1", Role: trust.RoleDecode, Name: "d0"}, nil, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := is.Write(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := trust.LoadFiles(dir, "decode-d0"); err == nil || !strings.Contains(err.Error(), "gossip key on line 1") {
		t.Fatalf("LoadFiles(bad gossip keys) = %v", err)
	}
}
