package kv

// The cross-read oracle. In a chaos build (-tags chaos) every page
// remembers which owner wrote each of its rows, across tenancies, and
// every read through a lease counts the rows it returns that another
// owner wrote: another tenant's (Tenant) or another request's of the same
// tenant (Request). A correct pool never returns such a row, since a read
// returns only rows its own tenancy wrote; the counts exist to prove it
// under faults, and to catch a bug that breaks it (a read that returns the
// whole page, a write past a stale tag). A production build keeps no
// writers and counts nothing: the oracle's types are empty there and its
// calls compile to nothing.
//
// A published page's rows become its scope's (Page.Publish), and a read
// through a shared lease reads as its scope: any request of the scope may
// read them, and a read under another scope counts them as another
// tenant's.
//
// The counters of one pool's pages are shared, and atomic, because an
// actor system gives each page to its own goroutine: CrossRowsOf reads
// them from any goroutine. Nothing else of the oracle is shared.

// CrossRows counts rows that reads returned although another owner than
// the reader wrote them.
type CrossRows struct {
	// Tenant counts rows another tenant wrote.
	Tenant uint64
	// Request counts rows another request of the reader's tenant wrote.
	Request uint64
}
