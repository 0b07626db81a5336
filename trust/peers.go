package trust

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"sync"
	"time"
)

// Peers is the address book of one node or client: for each host:port,
// the identity and certificate of whoever proved, in a TLS handshake we
// started ourselves, that it serves there. A TLS server proves possession
// of its key, so an entry can only come from the holder of that
// certificate; a peer that claims an address (as its protoactor sender
// address) is believed only if the certificate it presented is the one
// found at that address. It is safe for concurrent use.
type Peers struct {
	b         *Bundle
	max       int
	dialAfter time.Duration
	mu        sync.Mutex
	byAddr    map[string]peerEntry
}

type peerEntry struct {
	id   Identity
	fp   [32]byte
	seen time.Time
}

func newPeers(b *Bundle, max int, dialTimeout time.Duration) *Peers {
	return &Peers{b: b, max: max, dialAfter: dialTimeout, byAddr: map[string]peerEntry{}}
}

// record notes that the holder of cert serves at addr.
func (p *Peers) record(addr string, id Identity, cert *x509.Certificate) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.byAddr[addr]; !ok && len(p.byAddr) >= p.max {
		p.evictOldest()
	}
	p.byAddr[addr] = peerEntry{id: id, fp: Fingerprint(cert), seen: time.Now()}
}

// evictOldest drops the entry seen longest ago; it is found again by
// dialing when needed. Called with mu held.
func (p *Peers) evictOldest() {
	var oldest string
	var at time.Time
	for a, e := range p.byAddr {
		if oldest == "" || e.seen.Before(at) {
			oldest, at = a, e.seen
		}
	}
	delete(p.byAddr, oldest)
}

// At is the identity proven to serve at addr, if any.
func (p *Peers) At(addr string) (Identity, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.byAddr[addr]
	return e.id, ok
}

// AddressError is a peer that claims an address whose server is someone
// else (or no one).
type AddressError struct {
	Addr    string
	Claimed Identity
	Found   Identity // zero if nothing answered
	Err     error    // why nothing answered
}

func (e *AddressError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("trust: %s claims address %s, where no kvwarden peer answers: %v", e.Claimed, e.Addr, e.Err)
	}
	return fmt.Sprintf("trust: %s claims address %s, which is served by %s", e.Claimed, e.Addr, e.Found)
}

func (e *AddressError) Is(target error) bool { return target == ErrNotAuthenticated }

// Verify checks that the peer holding cert (identity id) serves at addr:
// from the book when the certificate found there last time is this one,
// else by dialing addr and comparing.
func (p *Peers) Verify(addr string, id Identity, cert *x509.Certificate) error {
	fp := Fingerprint(cert)
	p.mu.Lock()
	e, ok := p.byAddr[addr]
	if ok && e.fp == fp {
		e.seen = time.Now() // in use: the last to be forgotten
		p.byAddr[addr] = e
	}
	p.mu.Unlock()
	if ok && e.fp == fp {
		return nil
	}
	found, foundCert, err := p.Probe(addr)
	if err != nil {
		return &AddressError{Addr: addr, Claimed: id, Err: err}
	}
	if Fingerprint(foundCert) != fp {
		return &AddressError{Addr: addr, Claimed: id, Found: found}
	}
	return nil
}

// Probe dials addr, completes a TLS handshake as a client, records who
// answered and hangs up.
func (p *Peers) Probe(addr string) (Identity, *x509.Certificate, error) {
	return p.ProbeContext(context.Background(), addr)
}

// ProbeContext is Probe, given up when ctx is done.
func (p *Peers) ProbeContext(ctx context.Context, addr string) (Identity, *x509.Certificate, error) {
	ctx, cancel := context.WithTimeout(ctx, p.dialAfter)
	defer cancel()
	d := &tls.Dialer{Config: p.b.ClientTLS()}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return Identity{}, nil, err
	}
	conn := c.(*tls.Conn)
	defer conn.Close()
	id, cert, err := p.b.PeerIdentity(conn.ConnectionState(), x509.ExtKeyUsageServerAuth)
	if err != nil {
		return Identity{}, nil, err
	}
	p.record(addr, id, cert)
	return id, cert, nil
}
