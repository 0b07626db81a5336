package httpapi

import (
	"net/netip"
	"time"
)

// authFailures is the pure core of the bad-key throttle: the failed
// authentications of each client (clientKey) in its current window. A
// client that fails more than max times in one window is throttled for
// penalty: every failure of its until then is answered 429 rather than
// 401. It remembers at most clientsMax clients; when it is full, a client
// it does not know is not throttled (its failures are still 401 and
// counted), since evicting a throttled one would let a prober with many
// addresses free its own. Time is an argument; not safe for concurrent
// use.
type authFailures struct {
	max             int
	window, penalty time.Duration
	clientsMax      int
	byClient        map[netip.Prefix]*failures
	// noneExpireBefore is, once the table was found full, the earliest
	// any client of it expires: until then a sweep would free nothing,
	// so a full table costs a stranger's request no sweep.
	noneExpireBefore time.Time
}

// failures are one client's failed authentications.
type failures struct {
	count int       // in the window that began at since
	since time.Time // when the window began
	until time.Time // throttled until, if after now
}

func newAuthFailures(l Limits) *authFailures {
	return &authFailures{max: l.AuthFailuresMax, window: l.AuthFailureWindow, penalty: l.AuthPenalty,
		clientsMax: l.AuthAddrsMax, byClient: map[netip.Prefix]*failures{}}
}

// fail counts a failed authentication of client k at now and returns how
// long k is throttled for from now: 0 when it is not. began says the
// failure is the one that throttled it.
func (a *authFailures) fail(k netip.Prefix, now time.Time) (wait time.Duration, began bool) {
	f := a.byClient[k]
	if f == nil {
		if len(a.byClient) >= a.clientsMax && !a.sweep(now) {
			return 0, false
		}
		f = &failures{since: now}
		a.byClient[k] = f
	}
	if now.Before(f.until) {
		return f.until.Sub(now), false
	}
	if now.Sub(f.since) >= a.window {
		f.count, f.since = 0, now
	}
	if f.count++; f.count <= a.max {
		return 0, false
	}
	f.until, f.count, f.since = now.Add(a.penalty), 0, now.Add(a.penalty)
	return a.penalty, true
}

// expiry is when f no longer needs remembering: its window and its
// penalty both over.
func (a *authFailures) expiry(f *failures) time.Time {
	end := f.since.Add(a.window)
	if f.until.After(end) {
		return f.until
	}
	return end
}

// sweep forgets the clients whose window and penalty are over at now and
// says whether it freed room; when it freed none it remembers the first
// expiry, and does not sweep again before then.
func (a *authFailures) sweep(now time.Time) bool {
	if now.Before(a.noneExpireBefore) {
		return false
	}
	var first time.Time
	for k, f := range a.byClient {
		switch e := a.expiry(f); {
		case !now.Before(e):
			delete(a.byClient, k)
		case first.IsZero() || e.Before(first):
			first = e
		}
	}
	if len(a.byClient) < a.clientsMax {
		return true
	}
	a.noneExpireBefore = first
	return false
}
