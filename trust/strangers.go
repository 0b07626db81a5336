package trust

import (
	"net"
	"time"
)

// StrangerLimits bound the connections one listener holds before they
// prove an identity (their TLS handshake, or a data plane's hello).
type StrangerLimits struct {
	// Max is the most at once, in all.
	Max int
	// PerAddrMax is the most at once from one IP address that is not one
	// of the cluster's own (Authority.Proven).
	PerAddrMax int
	// Reserved is the share of Max only the cluster's own addresses may
	// take: strangers together hold at most Max - Reserved.
	Reserved int
}

// Strangers counts the connections of one listener that have not proven
// an identity yet, by IP address, and decides whether one more may wait:
// one address holds at most its share, and strangers leave the reserved
// share to the cluster's own addresses, so that a node's connection gets
// in while strangers hold every slot they may. A pure core: the caller
// holds the lock.
type Strangers struct {
	lim    StrangerLimits
	total  int
	byHost map[string]int
}

// NewStrangers counts within lim.
func NewStrangers(lim StrangerLimits) *Strangers {
	return &Strangers{lim: lim, byHost: map[string]int{}}
}

// Take admits a connection from host, one of the cluster's own addresses
// when proven, or says which bound refused it (RefusedHandshakesAddr or
// RefusedHandshakes). An own address is bounded only by Max: every node
// of a cluster on one machine shares its address.
func (s *Strangers) Take(host string, proven bool) (Refusal, bool) {
	switch {
	case s.total >= s.lim.Max:
		return RefusedHandshakes, false
	case proven:
	case s.byHost[host] >= s.lim.PerAddrMax:
		return RefusedHandshakesAddr, false
	case s.total >= s.lim.Max-s.lim.Reserved:
		return RefusedHandshakes, false
	}
	s.total++
	s.byHost[host]++
	return 0, true
}

// Give ends a wait Take admitted.
func (s *Strangers) Give(host string) {
	s.total--
	if s.byHost[host]--; s.byHost[host] <= 0 {
		delete(s.byHost, host)
	}
}

// Waiting is the connections admitted and not yet given back.
func (s *Strangers) Waiting() int { return s.total }

// provenAddrs remembers the IP addresses from which one of the cluster's
// own identities completed a TLS handshake (the TCP handshake before it
// proves the address), for ttl and at most max of them, the oldest
// forgotten first. A pure core: the caller holds the lock and passes the
// time.
type provenAddrs struct {
	max int
	ttl time.Duration
	m   map[string]time.Time
}

func (p *provenAddrs) note(host string, now time.Time) {
	if _, ok := p.m[host]; !ok && len(p.m) >= p.max {
		var oldest string
		var at time.Time
		for h, t := range p.m {
			if at.IsZero() || t.Before(at) {
				oldest, at = h, t
			}
		}
		delete(p.m, oldest)
	}
	p.m[host] = now
}

func (p *provenAddrs) has(host string, now time.Time) bool {
	at, ok := p.m[host]
	if ok && now.Sub(at) >= p.ttl {
		delete(p.m, host)
		return false
	}
	return ok
}

// Proven notes that one of the cluster's own identities (Role.IsCluster)
// connected from addr (host:port or host): for ProvenAddrTTL, connections
// from its host may take the share of each listener reserved for the
// cluster's own.
func (a *Authority) Proven(addr string) {
	a.provenMu.Lock()
	defer a.provenMu.Unlock()
	a.proven.note(HostOf(addr), time.Now())
}

// IsProven says whether one of the cluster's own identities connected
// from addr's host within ProvenAddrTTL.
func (a *Authority) IsProven(addr string) bool {
	a.provenMu.Lock()
	defer a.provenMu.Unlock()
	return a.proven.has(HostOf(addr), time.Now())
}

// admitStranger registers a remote connection before its TLS handshake,
// or counts and logs its refusal.
func (a *Authority) admitStranger(raw net.Conn) bool {
	from := raw.RemoteAddr().String()
	host, proven := HostOf(from), a.IsProven(from)
	a.strangersMu.Lock()
	r, ok := a.strangers.Take(host, proven)
	a.strangersMu.Unlock()
	if !ok {
		a.Refuse(r, "remote connection before its TLS handshake", "peer", from,
			"remote_handshakes_max", a.cfg.RemoteHandshakesMax, "remote_handshakes_per_addr_max", a.cfg.RemoteHandshakesPerAddrMax,
			"remote_handshakes_reserved", a.cfg.RemoteHandshakesReserved)
	}
	return ok
}

func (a *Authority) strangerDone(raw net.Conn) {
	a.strangersMu.Lock()
	defer a.strangersMu.Unlock()
	a.strangers.Give(HostOf(raw.RemoteAddr().String()))
}
