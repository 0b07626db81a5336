//go:build !chaos

package kv

// rowWriters keeps nothing in a production build.
type rowWriters struct{}

func (*rowWriters) wrote(row, count, pageTokens int, owner Owner) {}

func (*rowWriters) published(owner Owner) {}

func (*rowWriters) read(c *crossCounters, bpt int, reader Owner, page, got []byte) {}

// crossCounters counts nothing in a production build.
type crossCounters struct{}

// CrossRowsOf is zero in a production build.
func CrossRowsOf(pages []Page) CrossRows { return CrossRows{} }
