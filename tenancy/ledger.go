package tenancy

import (
	"fmt"

	"github.com/kvwarden/kvwarden/messages"
)

// Bound is which of a tenant's bounds refused a request. The values are
// stable: status and metrics report counts by them.
type Bound uint8

const (
	// BoundConcurrent: the tenant had ConcurrentMax requests in flight.
	BoundConcurrent Bound = iota
	// BoundPages: the request's pages would take the tenant past PagesMax.
	BoundPages
	boundKinds
)

var boundNames = [boundKinds]string{"concurrent_max", "pages_max"}

func (b Bound) String() string {
	if b < boundKinds {
		return boundNames[b]
	}
	return "unknown"
}

// BoundNames are the names of Bounds' values, in order.
func BoundNames() []string { return boundNames[:] }

// LimitError is a request refused because its tenant is at one of its
// bounds: Have is what the tenant has in flight (requests or pages), Want
// what the request adds, Limit the bound.
type LimitError struct {
	Tenant            string
	Bound             Bound
	Have, Want, Limit int
}

func (e *LimitError) Error() string {
	what := "requests"
	if e.Bound == BoundPages {
		what = "KV pages"
	}
	return fmt.Sprintf("tenancy: tenant %q has %d %s in flight and asks %d more, its %s is %d",
		e.Tenant, e.Have, what, e.Want, e.Bound, e.Limit)
}

// Wire is what a client is told of e: busy (it passes as the tenant's
// requests end), where "tenant concurrent_max" or "tenant pages_max".
func (e *LimitError) Wire() *messages.WireError {
	return &messages.WireError{Code: messages.CodeBusy, Message: e.Error(), Have: uint64(e.Have),
		Limit: uint64(e.Limit), Where: "tenant " + e.Bound.String()}
}

// use is what one tenant has in flight at an admission point.
type use struct {
	Requests, Pages int
}

// Ledger holds each tenant to its share's bounds at one admission point:
// it counts every tenant's requests and pages in flight (a tenant with
// nothing in flight has no entry, so the ledger holds no more entries than
// requests). Its actor counts the refusals, by bound (the LimitError's).
// Not safe for concurrent use: its actor calls it.
type Ledger struct {
	use map[string]use
}

// NewLedger is a ledger with nothing in flight.
func NewLedger() *Ledger { return &Ledger{use: map[string]use{}} }

// Room refuses a request of tenant that is at its share's concurrent_max:
// Take's first check, which needs none of the request's work (the pages it
// holds need its prompt's tokens), so that a tenant at its bound is
// refused before it costs any.
func (l *Ledger) Room(p *Policy, tenant string) error {
	if s, u := p.Of(tenant), l.use[tenant]; u.Requests >= s.ConcurrentMax {
		return &LimitError{Tenant: tenant, Bound: BoundConcurrent, Have: u.Requests, Want: 1, Limit: s.ConcurrentMax}
	}
	return nil
}

// Take counts a request of tenant holding pages in flight, unless it would
// take the tenant past a bound of its share in p; each Take that succeeds
// is followed by exactly one Give of the same pages. A bound that a reload
// lowered below what is in flight refuses new requests until enough end.
func (l *Ledger) Take(p *Policy, tenant string, pages int) error {
	if err := l.Room(p, tenant); err != nil {
		return err
	}
	s, u := p.Of(tenant), l.use[tenant]
	if s.PagesMax > 0 && u.Pages+pages > s.PagesMax {
		return &LimitError{Tenant: tenant, Bound: BoundPages, Have: u.Pages, Want: pages, Limit: s.PagesMax}
	}
	l.use[tenant] = use{Requests: u.Requests + 1, Pages: u.Pages + pages}
	return nil
}

// Give counts a request that Take counted as ended.
func (l *Ledger) Give(tenant string, pages int) {
	u := l.use[tenant]
	u.Requests--
	u.Pages -= pages
	switch {
	case u.Requests < 0 || u.Pages < 0 || u.Requests == 0 && u.Pages != 0:
		panic(fmt.Sprintf("tenancy: tenant %q has %d requests of %d pages in flight after a Give of %d pages",
			tenant, u.Requests, u.Pages, pages))
	case u.Requests == 0:
		delete(l.use, tenant)
	default:
		l.use[tenant] = u
	}
}

// Tenants is how many tenants have requests in flight.
func (l *Ledger) Tenants() int { return len(l.use) }
