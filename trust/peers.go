package trust

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
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
	probeWait time.Duration
	mu        sync.Mutex
	byAddr    map[string]peerEntry
	probes    claimProbes   // of claims under way
	freed     chan struct{} // closed, and replaced, when a claim probe ends
	failed    claimFailures // claims whose probe failed lately
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

func newPeers(b *Bundle, cfg Config) *Peers {
	return &Peers{b: b, max: cfg.PeersMax, dialAfter: cfg.DialTimeout, probeWait: cfg.ClaimProbeWait, byAddr: map[string]peerEntry{},
		probes: newClaimProbes(cfg), freed: make(chan struct{}), failed: newClaimFailures(cfg)}
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
	fp := Fingerprint(cert)
	p.byAddr[addr] = peerEntry{id: id, fp: fp, seen: time.Now(), streams: e.streams}
	p.failed.forget(claimKey{addr: addr, fp: fp})
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
// else (or no one), or whose claim was not probed (Err is then a
// *ClaimLimitError).
type AddressError struct {
	Addr    string
	Claimed Identity
	Found   Identity // zero if nothing answered
	Err     error    // why nothing answered
	// Remembered says the probe ran for an earlier claim, within
	// ClaimFailureTTL, and was not run again.
	Remembered bool
}

func (e *AddressError) Error() string {
	again := ""
	if e.Remembered {
		again = " (probed lately, not again)"
	}
	if e.Err != nil {
		return fmt.Sprintf("trust: %s claims address %s, where no kvwarden peer answers%s: %v", e.Claimed, e.Addr, again, e.Err)
	}
	return fmt.Sprintf("trust: %s claims address %s, which is served by %s%s", e.Claimed, e.Addr, e.Found, again)
}

func (e *AddressError) Is(target error) bool { return target == ErrNotAuthenticated }

func (e *AddressError) Unwrap() error { return e.Err }

// Refusal is the kind of refusal e is counted as: of the address, of a
// bound on probes, or of a claim that failed lately.
func (e *AddressError) Refusal() Refusal {
	var le *ClaimLimitError
	switch {
	case errors.As(e.Err, &le):
		return le.Refusal
	case e.Remembered:
		return RefusedClaimRemembered
	}
	return RefusedAddress
}

// Verify checks that the peer holding cert (identity id), connected from
// from (host:port), serves at addr: from the book when the certificate
// found there last time is this one, else, unless the same claim failed
// within ClaimFailureTTL, by dialing addr and comparing. A claim waits at
// most ClaimProbeWait for a probe it may start: one identity, one host and
// the tenants together may each have only so many under way.
func (p *Peers) Verify(from, addr string, id Identity, cert *x509.Certificate) error {
	key := claimKey{addr: addr, fp: Fingerprint(cert)}
	host := HostOf(from)
	start := time.Now()
	var limit *ClaimLimitError
	for wait := (<-chan time.Time)(nil); ; {
		p.mu.Lock()
		now := time.Now()
		if e, ok := p.byAddr[addr]; ok && e.fp == key.fp {
			e.seen = now // in use: the last to be forgotten
			p.byAddr[addr] = e
			p.mu.Unlock()
			return nil
		}
		if err, ok := p.failed.recall(key, now); ok {
			p.mu.Unlock()
			return err
		}
		if limit = p.probes.take(id, host); limit == nil {
			p.mu.Unlock()
			break
		}
		freed := p.freed
		p.mu.Unlock()
		if wait == nil {
			t := time.NewTimer(p.probeWait)
			defer t.Stop()
			wait = t.C
		}
		select {
		case <-freed:
			continue
		case <-wait:
		}
		limit.Waited = time.Since(start).Round(time.Millisecond)
		return &AddressError{Addr: addr, Claimed: id, Err: limit}
	}
	ae := p.probe(key, id)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.probes.give(id, host)
	close(p.freed)
	p.freed = make(chan struct{})
	if ae != nil && !errors.Is(ae.Err, ErrBookFull) {
		p.failed.remember(key, ae, time.Now())
	}
	if ae == nil {
		return nil
	}
	return ae
}

// probe dials the claimed address and compares the certificate found
// there with the claimant's.
func (p *Peers) probe(key claimKey, id Identity) *AddressError {
	found, foundCert, err := p.Probe(key.addr)
	switch {
	case err != nil:
		return &AddressError{Addr: key.addr, Claimed: id, Err: err}
	case Fingerprint(foundCert) != key.fp:
		return &AddressError{Addr: key.addr, Claimed: id, Found: found}
	}
	return nil
}

// HostOf is the host of a host:port, or the whole string when it has no
// port.
func HostOf(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
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
