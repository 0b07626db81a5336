package client

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Bounds of the time an endpoint that failed is skipped for.
const (
	// EndpointBackoffMin is how long an endpoint is skipped after its
	// first failure: its connection ended, it refused TCP or its
	// certificate, or it could not be reached.
	EndpointBackoffMin = 250 * time.Millisecond
	// EndpointBackoffMax bounds the backoff, which doubles with every
	// failure in a row: an endpoint that comes back is used again within
	// this long.
	EndpointBackoffMax = 5 * time.Second
	// probeTrust is how long a probe that found an endpoint answering
	// stands for its connection, until protoactor reports that connection
	// up: a request to an endpoint that died since would wait for
	// protoactor's connection retries (about 10 s) before it is told.
	probeTrust = time.Second
)

// endpointSet is the client's view of its endpoints: which may take a
// request now, which must be probed first, and which are skipped until
// when. It is the pure core of the endpoint choice: the caller holds the
// lock and passes the time in.
type endpointSet struct {
	eps  []endpointState
	next int // where the round robin looks first
}

type endpointState struct {
	addr string
	// connected: the client's connection to it is up. Otherwise pick
	// probes it first, unless a probe found it answering before
	// trustedUntil.
	connected    bool
	trustedUntil time.Time
	probing      bool      // a probe of it is under way
	downUntil    time.Time // skipped before then
	backoff      time.Duration
	why          string // the last failure, for errors
}

// choice is what pick found: the endpoint to use (index), whether it must
// be probed first, or (index -1) whether an endpoint being probed may yet
// become usable (wait) or none is left.
type choice struct {
	index int
	probe bool
	wait  bool
}

func newEndpointSet(addrs []string) *endpointSet {
	s := &endpointSet{}
	for _, a := range addrs {
		s.eps = append(s.eps, endpointState{addr: a})
	}
	return s
}

// pick chooses, round robin, the next endpoint not in tried and not
// skipped at now. One that may not be reachable is marked probing and
// returned with probe set; the caller reports the probe's outcome with
// probed. An endpoint already being probed is left to that probe: when
// nothing else is usable, pick says wait.
func (s *endpointSet) pick(now time.Time, tried []int) choice {
	wait := false
	for k := range s.eps {
		i := (s.next + k) % len(s.eps)
		e := &s.eps[i]
		if slices.Contains(tried, i) || now.Before(e.downUntil) {
			continue
		}
		if e.probing {
			wait = true
			continue
		}
		s.next = i + 1
		if !e.connected && !now.Before(e.trustedUntil) {
			e.probing = true
			return choice{index: i, probe: true}
		}
		return choice{index: i}
	}
	return choice{index: -1, wait: wait}
}

// probed records the outcome of a probe: nil trusts the endpoint for
// probeTrust, an error skips it for its backoff.
func (s *endpointSet) probed(i int, now time.Time, err error) {
	s.eps[i].probing = false
	if err != nil {
		s.failed(i, now, err.Error())
		return
	}
	s.eps[i].trustedUntil = now.Add(probeTrust)
}

// failed skips endpoint i from now for its backoff, which doubles up to
// EndpointBackoffMax, and makes it be probed before its next use.
func (s *endpointSet) failed(i int, now time.Time, why string) {
	e := &s.eps[i]
	e.backoff = min(max(2*e.backoff, EndpointBackoffMin), EndpointBackoffMax)
	e.downUntil, e.connected, e.trustedUntil, e.why = now.Add(e.backoff), false, time.Time{}, why
}

// connected records that the client's connection to endpoint i is up: the
// failures in a row are over.
func (s *endpointSet) connected(i int) {
	e := &s.eps[i]
	e.connected, e.backoff, e.downUntil, e.why = true, 0, time.Time{}, ""
}

// index is the endpoint serving at addr, -1 if none.
func (s *endpointSet) index(addr string) int {
	for i, e := range s.eps {
		if e.addr == addr {
			return i
		}
	}
	return -1
}

// describe names every endpoint and, for one that failed, why and for how
// much longer it is skipped: what a request that found none left is told.
func (s *endpointSet) describe(now time.Time) string {
	parts := make([]string, len(s.eps))
	for i, e := range s.eps {
		switch {
		case now.Before(e.downUntil):
			parts[i] = fmt.Sprintf("%s (%s; skipped for %s more)", e.addr, e.why, e.downUntil.Sub(now).Round(time.Millisecond))
		case e.why != "":
			parts[i] = fmt.Sprintf("%s (%s)", e.addr, e.why)
		default:
			parts[i] = e.addr
		}
	}
	return strings.Join(parts, ", ")
}
