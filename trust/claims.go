package trust

import (
	"fmt"
	"time"
)

// ClaimLimitError is a claimed address not probed: the bound named by
// Field (a Config field, or ClaimProbesMax less ClaimProbesReserved for a
// tenant) allows Max probes at once and that many were under way for as
// long as the claim may wait.
type ClaimLimitError struct {
	Refusal Refusal // RefusedClaimProbes or RefusedClaimPeer
	Field   string
	Max     int
	Waited  time.Duration
}

func (e *ClaimLimitError) Error() string {
	return fmt.Sprintf("%d claim probes under way for %s, the most %s allows", e.Max, e.Waited, e.Field)
}

// claimProbes counts the probes of claimed addresses under way, in all,
// by claimant identity and by claimant host, and decides whether one more
// may start: one peer takes at most its share, and tenants leave the
// reserved share to the cluster's own identities. A pure core: the caller
// holds the lock.
type claimProbes struct {
	max, reserved, perIdentity, perAddr int

	total  int
	byID   map[Identity]int
	byHost map[string]int
}

func newClaimProbes(cfg Config) claimProbes {
	return claimProbes{max: cfg.ClaimProbesMax, reserved: cfg.ClaimProbesReserved,
		perIdentity: cfg.ClaimProbesPerIdentityMax, perAddr: cfg.ClaimProbesPerAddrMax,
		byID: map[Identity]int{}, byHost: map[string]int{}}
}

// take starts a probe for id claiming from host, or says which bound is
// full.
func (c *claimProbes) take(id Identity, host string) *ClaimLimitError {
	switch {
	case c.byID[id] >= c.perIdentity:
		return &ClaimLimitError{Refusal: RefusedClaimPeer, Field: "ClaimProbesPerIdentityMax", Max: c.perIdentity}
	case c.byHost[host] >= c.perAddr:
		return &ClaimLimitError{Refusal: RefusedClaimPeer, Field: "ClaimProbesPerAddrMax", Max: c.perAddr}
	case c.total >= c.max:
		return &ClaimLimitError{Refusal: RefusedClaimProbes, Field: "ClaimProbesMax", Max: c.max}
	case !id.Role.IsCluster() && c.total >= c.max-c.reserved:
		return &ClaimLimitError{Refusal: RefusedClaimProbes, Field: "ClaimProbesMax less ClaimProbesReserved",
			Max: c.max - c.reserved}
	}
	c.total++
	c.byID[id]++
	c.byHost[host]++
	return nil
}

// give ends a probe take started.
func (c *claimProbes) give(id Identity, host string) {
	c.total--
	if c.byID[id]--; c.byID[id] <= 0 {
		delete(c.byID, id)
	}
	if c.byHost[host]--; c.byHost[host] <= 0 {
		delete(c.byHost, host)
	}
}

// claimKey is one claim: a certificate (its fingerprint) at an address.
type claimKey struct {
	addr string
	fp   [32]byte
}

type claimFailure struct {
	err *AddressError
	at  time.Time
}

// claimFailures remembers claims whose probe failed, for ttl and at most
// max of them (the oldest forgotten first), so that the same claim made
// again and again costs one probe per ttl. A claim that succeeds is
// remembered by the address book instead. A pure core: the caller holds
// the lock and passes the time.
type claimFailures struct {
	max int
	ttl time.Duration
	m   map[claimKey]claimFailure
}

func newClaimFailures(cfg Config) claimFailures {
	return claimFailures{max: cfg.ClaimFailuresMax, ttl: cfg.ClaimFailureTTL, m: map[claimKey]claimFailure{}}
}

// recall is the failure remembered for k, if it is younger than ttl.
func (f *claimFailures) recall(k claimKey, now time.Time) (*AddressError, bool) {
	e, ok := f.m[k]
	if !ok {
		return nil, false
	}
	if now.Sub(e.at) >= f.ttl {
		delete(f.m, k)
		return nil, false
	}
	err := *e.err
	err.Remembered = true
	return &err, true
}

// remember notes k's failure at now.
func (f *claimFailures) remember(k claimKey, err *AddressError, now time.Time) {
	if _, ok := f.m[k]; !ok && len(f.m) >= f.max {
		var oldest claimKey
		var at time.Time
		for key, e := range f.m {
			if at.IsZero() || e.at.Before(at) {
				oldest, at = key, e.at
			}
		}
		delete(f.m, oldest)
	}
	f.m[k] = claimFailure{err: err, at: now}
}

// forget drops k: the claim's certificate was just found at its address.
func (f *claimFailures) forget(k claimKey) { delete(f.m, k) }
