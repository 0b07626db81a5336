package messages

import (
	"fmt"

	"github.com/asynkron/protoactor-go/remote"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvwarden/kvwarden/kv"
)

// A router asks each prefilling or decoding node, every so often, what its
// workers' prefix caches hold, so that it sends a prompt to the nodes that
// hold its prefix even when another router sent it there, and stops
// sending it to one that gave it up. Only routers may ask; the answer
// names pages by their cache keys (kv.PrefixKey), which chain from each
// request's scope, so it tells a router nothing of any prompt it was not
// given itself.

// CacheSummaryRequest asks a prefilling or decoding node for its
// CacheSummary. It has no fields.
type CacheSummaryRequest struct{}

var cacheSummaryRequestKeys = []string{}

func (*CacheSummaryRequest) TypeCode() TypeCode { return TypeCacheSummaryRequest }

func (*CacheSummaryRequest) Validate() error { return nil }

func (*CacheSummaryRequest) DecodeMsgpack(d *msgpack.Decoder) error {
	return fields(d, TypeCacheSummaryRequest, cacheSummaryRequestKeys, func(int) error { return nil })
}

// CacheSummary is a node's answer to a CacheSummaryRequest: the keys of
// the pages its prefix caches hold, most recently used first, at most
// CacheSummaryKeysMax of them (a node that holds more leaves out the least
// recently used).
type CacheSummary struct {
	// Incarnation is the answering node's run: a summary is of that run's
	// caches only.
	Incarnation uint64         `msgpack:"inc"`
	Keys        []kv.PrefixKey `msgpack:"keys"`
	// DecodeCache says the node's decode workers keep prefix caches: a
	// router remembers where it sent a prompt's decode only then.
	DecodeCache bool `msgpack:"decode_cache,omitempty"`
}

var cacheSummaryKeys = []string{"inc", "keys", "decode_cache"}

func (*CacheSummary) TypeCode() TypeCode { return TypeCacheSummary }

func (m *CacheSummary) Validate() error {
	const t = TypeCacheSummary
	if m.Incarnation == 0 {
		return &InvalidFieldError{t, "inc", "0", "a non-zero incarnation"}
	}
	return checkLen(t, "keys", len(m.Keys), CacheSummaryKeysMax)
}

func (m *CacheSummary) DecodeMsgpack(d *msgpack.Decoder) error {
	const t = TypeCacheSummary
	return fields(d, t, cacheSummaryKeys, func(i int) error {
		switch i {
		case 0:
			return readU64(d, t, "inc", &m.Incarnation)
		case 2:
			return readBool(d, t, "decode_cache", &m.DecodeCache)
		}
		return readSlice(d, t, "keys", CacheSummaryKeysMax, &m.Keys, func(k *kv.PrefixKey) error {
			b, err := d.DecodeBytes()
			switch {
			case err != nil:
				return malformed(t, "keys", err)
			case len(b) != len(k):
				return &InvalidFieldError{t, "keys", fmt.Sprintf("a key of %d bytes", len(b)), "16 bytes a key"}
			}
			copy(k[:], b)
			return nil
		})
	})
}

func (m *CacheSummaryRequest) Serialize() (remote.RootSerialized, error) { return serialize(m) }
func (m *CacheSummary) Serialize() (remote.RootSerialized, error)        { return serialize(m) }
