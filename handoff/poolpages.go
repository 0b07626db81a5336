package handoff

import (
	"time"

	"github.com/kvwarden/kvwarden/kv"
)

// PoolPages is a *kv.Pool as Pages, for a caller that owns the pool (one
// goroutine) and keeps the time: Now is read by Reserve and Release.
type PoolPages struct {
	*kv.Pool
	Now func() time.Time
}

// Reserve takes n pages at Now.
func (p PoolPages) Reserve(owner kv.Owner, first, n int) ([]kv.Tag, error) {
	return p.Pool.Reserve(owner, first, n, p.Now())
}

// WriteOwned is Write: the pool copies into its arena anyway.
func (p PoolPages) WriteOwned(tag kv.Tag, owner kv.Owner, first int, data []byte) error {
	return p.Pool.Write(tag, owner, first, data)
}

// Release gives a page back at Now.
func (p PoolPages) Release(tag kv.Tag, owner kv.Owner) error {
	_, err := p.Pool.Release(tag, owner, p.Now())
	return err
}
