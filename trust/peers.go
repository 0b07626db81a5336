package trust

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
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
	probes    chan struct{} // one token per probe a claim may start at once
	mu        sync.Mutex
	byAddr    map[string]peerEntry
}

type peerEntry struct {
	id      Identity
	fp      [32]byte
	seen    time.Time
	streams int // inbound streams bound to the address: never forgotten while any is open
}

// ErrBookFull is an address the book cannot take: every address it holds
// has a live stream.
var ErrBookFull = errors.New("trust: address book full, every address in it has a live stream")

func newPeers(b *Bundle, max, probesMax int, dialTimeout time.Duration) *Peers {
	return &Peers{b: b, max: max, dialAfter: dialTimeout, byAddr: map[string]peerEntry{},
		probes: make(chan struct{}, probesMax)}
}

// record notes that the holder of cert serves at addr; false when the
// book is full of addresses with live streams.
func (p *Peers) record(addr string, id Identity, cert *x509.Certificate) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.byAddr[addr]
	if !ok && len(p.byAddr) >= p.max && !p.evictOldest() {
		return false
	}
	p.byAddr[addr] = peerEntry{id: id, fp: Fingerprint(cert), seen: time.Now(), streams: e.streams}
	return true
}

// evictOldest drops the entry seen longest ago that no live stream is bound
// to; it is found again by dialing when needed. Called with mu held.
func (p *Peers) evictOldest() bool {
	var oldest string
	var at time.Time
	for a, e := range p.byAddr {
		if e.streams == 0 && (oldest == "" || e.seen.Before(at)) {
			oldest, at = a, e.seen
		}
	}
	if oldest == "" {
		return false
	}
	delete(p.byAddr, oldest)
	return true
}

// pin binds a live inbound stream to addr's entry, which is then not
// forgotten until unpin; false when there is no entry.
func (p *Peers) pin(addr string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.byAddr[addr]
	if ok {
		e.streams++
		p.byAddr[addr] = e
	}
	return ok
}

func (p *Peers) unpin(addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e, ok := p.byAddr[addr]; ok && e.streams > 0 {
		e.streams--
		p.byAddr[addr] = e
	}
}

// At is the identity proven to serve at addr, if any. A look-up counts as
// a use: the entries in use are the last to be forgotten.
func (p *Peers) At(addr string) (Identity, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.byAddr[addr]
	if ok {
		e.seen = time.Now()
		p.byAddr[addr] = e
	}
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
	select {
	case p.probes <- struct{}{}:
		defer func() { <-p.probes }()
	default:
		return &AddressError{Addr: addr, Claimed: id, Err: fmt.Errorf("%d probes under way, the most at once", cap(p.probes))}
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
	if !p.record(addr, id, cert) {
		return Identity{}, nil, ErrBookFull
	}
	return id, cert, nil
}
