package messages

import (
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// TokenBatch carries, from one process to another, the token chunks and
// results of every stream bound there that were ready together: a decode
// node's step makes one token for each of its sequences, and the requests
// of one router (or one client) travel as one message instead of one each.
// Each item names the actor it is for by its id in the receiving process;
// the receiver hands each item to that actor's stream (Inbox), in order,
// and the actor checks it exactly as it checks a TokenChunk or
// GenerateResult sent to it alone: the batch's sender is the item's
// sender.
//
// A process asks for batches by the name of the actor that sends a
// GenerateRequest or RoutedRequest (BatchedName): a node sends such a
// request's answer in batches to that process's Inbox, any other's with
// TokenChunk and GenerateResult messages to the sender, as builds before
// batches do. A name is no wire field: every build reads both requests
// alike, and a build that knows nothing of batches answers the sender
// itself, which takes those too.
type TokenBatch struct {
	// Items holds 1 to StreamItemsMax items whose WireBytesMax sum to at
	// most StreamBatchBytesMax.
	Items []StreamItem `msgpack:"items"`
}

// StreamItem is one message of a TokenBatch: exactly one of Chunk and
// Result, for the actor To.
type StreamItem struct {
	// To is the receiving actor's id in its process, 1 to
	// StreamToBytesMax bytes.
	To     string          `msgpack:"to"`
	Chunk  *TokenChunk     `msgpack:"chunk,omitempty"`
	Result *GenerateResult `msgpack:"result,omitempty"`
}

// Bounds of a TokenBatch.
const (
	// StreamItemsMax bounds the items of one TokenBatch.
	StreamItemsMax = 4096
	// StreamToBytesMax bounds StreamItem.To in bytes: an actor id, such
	// as a secret name's 32 hex digits under a prefix.
	StreamToBytesMax = 128
	// StreamBatchBytesMax bounds the sum of a TokenBatch's items'
	// WireBytesMax, in bytes: every valid batch fits MessageBytesMax.
	StreamBatchBytesMax = MessageBytesMax - 4096
)

// Message is the item's TokenChunk or GenerateResult, whichever it
// carries.
func (it *StreamItem) Message() Message {
	if it.Chunk != nil {
		return it.Chunk
	}
	return it.Result
}

var (
	tokenBatchKeys = []string{"items"}
	streamItemKeys = []string{"to", "chunk", "result"}
)

func (*TokenBatch) TypeCode() TypeCode { return TypeTokenBatch }

// WireBytesMax bounds the bytes the item takes in a TokenBatch: what its
// fields can take at most, each token id as the 5 bytes of the largest
// uint32. A batch's sender closes the batch before the sum passes
// StreamBatchBytesMax; an item alone always fits.
func (it *StreamItem) WireBytesMax() int {
	const keysAndHeaders = 96 // map headers, keys, ids, sequence numbers, string and array headers
	n := keysAndHeaders + len(it.To)
	if c := it.Chunk; c != nil {
		n += 5*len(c.Tokens) + len(c.Text)
	}
	if r := it.Result; r != nil {
		n += 5*len(r.Tokens) + len(r.Text)
		if r.Err != nil {
			n += keysAndHeaders + len(r.Err.Message) + len(r.Err.Where)
		}
	}
	return n
}

func (m *TokenBatch) Validate() error {
	const t = TypeTokenBatch
	if err := checkRange(t, "items", uint64(len(m.Items)), 1, StreamItemsMax); err != nil {
		return err
	}
	bytes := 0
	for i := range m.Items {
		it := &m.Items[i]
		if err := it.validate(t); err != nil {
			return err
		}
		bytes += it.WireBytesMax()
	}
	if bytes > StreamBatchBytesMax {
		return &TooLargeError{t, "items", bytes, StreamBatchBytesMax}
	}
	return nil
}

func (it *StreamItem) validate(t TypeCode) error {
	if err := checkName(t, "to", it.To, StreamToBytesMax); err != nil {
		return err
	}
	switch {
	case (it.Chunk == nil) == (it.Result == nil):
		return &InvalidFieldError{t, "items", fmt.Sprintf("chunk %t, result %t", it.Chunk != nil, it.Result != nil), "exactly one of chunk and result"}
	case it.Chunk != nil:
		return it.Chunk.Validate()
	}
	return it.Result.Validate()
}

// DecodeMsgpack reads the items one by one, growing the slice as they
// come: an array header that claims StreamItemsMax items costs no more
// than the items that follow it.
func (m *TokenBatch) DecodeMsgpack(d *msgpack.Decoder) error {
	const t = TypeTokenBatch
	return fields(d, t, tokenBatchKeys, func(int) error {
		n, err := readLen(d, t, "items", StreamItemsMax)
		if err != nil {
			return err
		}
		m.Items = make([]StreamItem, 0, min(n, 64))
		for range n {
			var it StreamItem
			if err := fields(d, t, streamItemKeys, func(i int) error {
				switch i {
				case 0:
					return readString(d, t, "to", StreamToBytesMax, &it.To)
				case 1:
					it.Chunk = new(TokenChunk)
					return it.Chunk.DecodeMsgpack(d)
				default:
					it.Result = new(GenerateResult)
					return it.Result.DecodeMsgpack(d)
				}
			}); err != nil {
				return err
			}
			m.Items = append(m.Items, it)
		}
		return nil
	})
}
