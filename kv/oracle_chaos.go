//go:build chaos

package kv

import "sync/atomic"

// rowWriters is who wrote each row of one page, over the page's life: the
// owner a write presented, or the zero Owner for a row never written.
type rowWriters struct{ owners []Owner }

// wrote records that owner wrote count rows from row on.
func (w *rowWriters) wrote(row, count, pageTokens int, owner Owner) {
	if w.owners == nil {
		w.owners = make([]Owner, pageTokens)
	}
	for i := row; i < row+count; i++ {
		w.owners[i] = owner
	}
}

// published records that the page's rows are now owner's: a cached
// page's, which its scope's shared leases read.
func (w *rowWriters) published(owner Owner) {
	for i := range w.owners {
		w.owners[i] = owner
	}
}

// read counts in c the rows of got (rows of bpt bytes) that an owner other
// than reader wrote. got is what a read of page (the page's whole bytes)
// returns; rows of got that are not the page's, if any, are not counted.
func (w *rowWriters) read(c *crossCounters, bpt int, reader Owner, page, got []byte) {
	if len(got) == 0 || w.owners == nil || cap(got) > cap(page) ||
		&got[:cap(got)][cap(got)-1] != &page[:cap(page)][cap(page)-1] {
		return
	}
	off := cap(page) - cap(got)
	for _, o := range w.owners[off/bpt : (off+len(got)-1)/bpt+1] {
		switch {
		case o == (Owner{}) || o == reader:
		case o.Tenant != reader.Tenant:
			c.tenant.Add(1)
		default:
			c.request.Add(1)
		}
	}
}

// crossCounters are the cross reads of one pool's pages.
type crossCounters struct{ tenant, request atomic.Uint64 }

// CrossRowsOf is the cross reads of pages made by one NewPages (or one
// Pool), so far. It is safe to call from any goroutine while the pages are
// in use.
func CrossRowsOf(pages []Page) CrossRows {
	if len(pages) == 0 {
		return CrossRows{}
	}
	c := &pages[0].params.cross
	return CrossRows{Tenant: c.tenant.Load(), Request: c.request.Load()}
}
