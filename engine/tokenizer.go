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
	// Piece is the bytes id stands for when it follows prev in a sequence
	// (some tokenizers drop a leading space after BOS). Ids that stand for
	// no text (BOS, Stop, unknown) give nil. The bytes of consecutive
	// pieces may join into one UTF-8 character.
	Piece(prev, id int) []byte
}
