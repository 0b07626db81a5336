package engine

// Tokenizer turns text into a model's token ids and ids back into bytes.
// The model defines its tokens: admission, routing and the context window
// count what Encode returns, and generation ends at Stop.
type Tokenizer interface {
	// Vocab is the number of token ids, 0 to Vocab-1; it equals the
	// model's.
	Vocab() int
	// BOS is the id every encoded prompt starts with.
	BOS() int
	// Stop is the id that ends a generation when the model emits it.
	Stop() int
	// Encode returns BOS followed by text's tokens, so that an empty text
	// is a prompt of one token. It encodes every string, valid UTF-8 or
	// not, and never fails.
	Encode(text string) []int
	// PieceBytesMax is the most bytes one token stands for, so that a text
	// of n bytes is at least n / PieceBytesMax tokens.
	PieceBytesMax() int
	// Piece is the bytes id stands for when it follows prev in a sequence
	// (some tokenizers drop a leading space after BOS). Ids that stand for
	// no text (BOS, Stop, unknown) give nil. The bytes of consecutive
	// pieces may join into one UTF-8 character.
	Piece(prev, id int) []byte
}

// EncodeWithin is t.Encode(text) unless text certainly encodes to more
// than limit tokens, which it says without encoding: BOS and at least
// len(text) / PieceBytesMax tokens. Then ids is nil and atLeast is that
// count. A prompt far beyond any context window costs a length check, not
// an encoding.
func EncodeWithin(t Tokenizer, text string, limit int) (ids []int, atLeast int) {
	if atLeast = 1 + (len(text)+t.PieceBytesMax()-1)/t.PieceBytesMax(); atLeast > limit {
		return nil, atLeast
	}
	ids = t.Encode(text)
	return ids, len(ids)
}
