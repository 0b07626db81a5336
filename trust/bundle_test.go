package trust_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/trust"
	"github.com/kvwarden/kvwarden/trust/trusttest"
)

// tlsPair runs a real TLS 1.3 handshake over loopback TCP, server with
// srv, client with cli, and returns both ends' states and errors.
func tlsPair(t *testing.T, srv, cli *tls.Config) (s, c tls.ConnectionState, serr, cerr error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	deadline := time.Now().Add(10 * time.Second)
	done := make(chan struct{})
	go func() {
		defer close(done)
		raw, err := ln.Accept()
		if err != nil {
			serr = err
			return
		}
		defer raw.Close()
		_ = raw.SetDeadline(deadline)
		server := tls.Server(raw, srv)
		if serr = server.Handshake(); serr == nil {
			s = server.ConnectionState()
			_, serr = server.Write([]byte{1})
		}
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	_ = raw.SetDeadline(deadline)
	client := tls.Client(raw, cli)
	if cerr = client.Handshake(); cerr == nil {
		c = client.ConnectionState()
		// In TLS 1.3 the client is done before the server has checked its
		// certificate: the server's first byte, or its alert, says how
		// that went.
		var one [1]byte
		_, cerr = client.Read(one[:])
	}
	raw.Close()
	<-done
	return s, c, serr, cerr
}

// handshake connects client to server and checks that each proved its
// identity to the other.
func handshake(t *testing.T, server, client *trust.Bundle) {
	t.Helper()
	s, c, serr, cerr := tlsPair(t, server.ServerTLS(), client.ClientTLS())
	if serr != nil || cerr != nil {
		t.Fatalf("handshake %s ← %s: server %v, client %v", server.Self, client.Self, serr, cerr)
	}
	if c.Version != tls.VersionTLS13 {
		t.Fatalf("negotiated TLS %#x, want 1.3", c.Version)
	}
	got, _, err := server.PeerIdentity(s, x509.ExtKeyUsageClientAuth)
	if err != nil || got != client.Self {
		t.Fatalf("server sees %s (%v), want %s", got, err, client.Self)
	}
	got, leaf, err := client.PeerIdentity(c, x509.ExtKeyUsageServerAuth)
	if err != nil || got != server.Self || !leaf.Equal(server.Leaf) {
		t.Fatalf("client sees %s (%v), want %s", got, err, server.Self)
	}
}

func TestMutualTLSOneCA(t *testing.T) {
	ca := trusttest.New(t)
	decode, tenant := ca.Bundle(t, trust.RoleDecode, "d0"), ca.Bundle(t, trust.RoleTenant, "acme")
	handshake(t, decode, tenant)
	handshake(t, tenant, decode) // every process serves and dials
}

func TestForeignCARefusedBothWays(t *testing.T) {
	ours, theirs := trusttest.New(t), trusttest.New(t) // same cluster name, other key
	node, stranger := ours.Bundle(t, trust.RoleDecode, "d0"), theirs.Bundle(t, trust.RoleDecode, "d0")
	var ce *trust.CertError

	// An attacker's client does not care whom it reaches.
	reckless := stranger.ClientTLS()
	reckless.VerifyConnection = nil
	_, _, serr, cerr := tlsPair(t, node.ServerTLS(), reckless)
	if !errors.As(serr, &ce) || !strings.Contains(ce.Reason, "unknown authority") || cerr == nil {
		t.Fatalf("stranger dialing us: server %v, client %v; want the server to refuse with a CertError", serr, cerr)
	}
	if !errors.Is(serr, trust.ErrNotAuthenticated) {
		t.Fatalf("%v does not match ErrNotAuthenticated", serr)
	}
	_, _, serr, cerr = tlsPair(t, stranger.ServerTLS(), node.ClientTLS())
	if !errors.As(cerr, &ce) || !strings.Contains(ce.Reason, "unknown authority") {
		t.Fatalf("us dialing a stranger: server %v, client %v; want the client to refuse with a CertError", serr, cerr)
	}
}

func TestPeerWithoutCertificateRefused(t *testing.T) {
	node := trusttest.New(t).Bundle(t, trust.RoleDecode, "d0")
	_, _, serr, _ := tlsPair(t, node.ServerTLS(), &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13})
	if serr == nil || !strings.Contains(serr.Error(), "certificate") {
		t.Fatalf("client without a certificate: server %v, want a refusal", serr)
	}
	if _, _, err := node.PeerIdentity(tls.ConnectionState{}, x509.ExtKeyUsageClientAuth); !errors.Is(err, trust.ErrNotAuthenticated) {
		t.Fatalf("PeerIdentity(no certificates) = %v", err)
	}
}

// A peer that presents an expired certificate of the right CA is refused
// by the side that checks it (the peer's own bundle would refuse to load
// it, so it is presented by hand).
func TestExpiredCertificateRefused(t *testing.T) {
	ca := trusttest.New(t)
	node := ca.Bundle(t, trust.RoleDecode, "d0")
	old, err := ca.Issue(trust.Identity{Cluster: ca.Cluster, Role: trust.RoleTenant, Name: "acme"}, nil, time.Hour,
		time.Now().Add(-2*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(old.CertPEM, old.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	expired := &tls.Config{Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}
	var ce *trust.CertError
	if _, _, serr, _ := tlsPair(t, node.ServerTLS(), expired); !errors.As(serr, &ce) || !strings.Contains(ce.Reason, "expired") {
		t.Fatalf("expired client: server %v, want a CertError saying expired", serr)
	}
	if _, _, _, cerr := tlsPair(t, expired, node.ClientTLS()); !errors.As(cerr, &ce) || !strings.Contains(ce.Reason, "expired") {
		t.Fatalf("expired server: client %v, want a CertError saying expired", cerr)
	}
}
