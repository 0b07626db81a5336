package messages

import (
	"fmt"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvwarden/kvwarden/kv"
)

// The client API: a client sends GenerateRequest (and perhaps
// CancelRequest) and receives, if it asked to stream, TokenChunks in order,
// then exactly one GenerateResult.
//
// A request is named by (Tenant, RequestID). The client chooses RequestID;
// it must be non-zero and unique among that tenant's requests in flight.

// GenerateRequest asks for a greedy completion of Prompt.
type GenerateRequest struct {
	RequestID uint64 `msgpack:"id"`
	Tenant    string `msgpack:"tenant"`
	// Prompt is UTF-8 text, 0 to PromptBytesMax bytes: the model's BOS
	// comes first, so an empty prompt is a prompt of one token. Admission compares
	// its token count with the context window and the KV pools, which are
	// node configuration and usually far below what this limit allows.
	Prompt string `msgpack:"prompt"`
	// MaxTokens is how many tokens to generate at most, 1 to
	// GenerateTokensMax.
	MaxTokens uint32 `msgpack:"max_tokens"`
	// Stream asks for TokenChunks before the GenerateResult.
	Stream bool `msgpack:"stream,omitempty"`
	// CacheSalt, when set, narrows the request's prompt cache scope (the
	// one its tenant's credential gives) to the requests that name the
	// same salt, 0 to kv.CacheSaltBytesMax bytes of UTF-8: it can keep a
	// request from sharing cached prefixes, never make it share more.
	CacheSalt string `msgpack:"cache_salt,omitempty"`
}

var generateRequestKeys = []string{"id", "tenant", "prompt", "max_tokens", "stream", "cache_salt"}

func (*GenerateRequest) TypeCode() TypeCode { return TypeGenerateRequest }

func (m *GenerateRequest) Validate() error {
	const t = TypeGenerateRequest
	if err := checkOwner(t, m.RequestID, m.Tenant); err != nil {
		return err
	}
	if err := checkPrompt(t, m.Prompt, m.MaxTokens); err != nil {
		return err
	}
	return checkCacheSalt(t, m.CacheSalt)
}

// checkCacheSalt checks a request's cache_salt.
func checkCacheSalt(t TypeCode, salt string) error {
	if err := checkLen(t, "cache_salt", len(salt), kv.CacheSaltBytesMax); err != nil {
		return err
	}
	return checkUTF8(t, "cache_salt", salt)
}

// checkPrompt checks the prompt and max_tokens of a GenerateRequest or of
// the RoutedRequest it became.
func checkPrompt(t TypeCode, prompt string, maxTokens uint32) error {
	if err := checkLen(t, "prompt", len(prompt), PromptBytesMax); err != nil {
		return err
	}
	if err := checkUTF8(t, "prompt", prompt); err != nil {
		return err
	}
	return checkRange(t, "max_tokens", uint64(maxTokens), 1, GenerateTokensMax)
}

func (m *GenerateRequest) DecodeMsgpack(d *msgpack.Decoder) error {
	const t = TypeGenerateRequest
	return fields(d, t, generateRequestKeys, func(i int) error {
		switch i {
		case 0:
			return readU64(d, t, "id", &m.RequestID)
		case 1:
			return readString(d, t, "tenant", TenantBytesMax, &m.Tenant)
		case 2:
			return readString(d, t, "prompt", PromptBytesMax, &m.Prompt)
		case 3:
			return readU32(d, t, "max_tokens", &m.MaxTokens)
		case 4:
			return readBool(d, t, "stream", &m.Stream)
		default:
			return readString(d, t, "cache_salt", kv.CacheSaltBytesMax, &m.CacheSalt)
		}
	})
}

// TokenChunk carries the next tokens of a streamed answer. Seq counts
// chunks from 1 without gaps, so a client sees a lost chunk.
type TokenChunk struct {
	RequestID uint64 `msgpack:"id"`
	Seq       uint32 `msgpack:"seq,omitempty"`
	// Tokens holds 1 to ChunkTokensMax token ids.
	Tokens []uint32 `msgpack:"tokens"`
	// Text is the detokenized text of Tokens, at most TextBytesMax bytes:
	// whole UTF-8 characters, the bytes of one whose pieces have not all
	// come held back for a later chunk (or, at the end, the result). It is
	// not checked for UTF-8: a node of another build may split one.
	Text string `msgpack:"text,omitempty"`
}

var tokenChunkKeys = []string{"id", "seq", "tokens", "text"}

func (*TokenChunk) TypeCode() TypeCode { return TypeTokenChunk }

func (m *TokenChunk) Validate() error {
	const t = TypeTokenChunk
	if err := checkRequestID(t, m.RequestID); err != nil {
		return err
	}
	if err := checkRange(t, "tokens", uint64(len(m.Tokens)), 1, ChunkTokensMax); err != nil {
		return err
	}
	return checkLen(t, "text", len(m.Text), TextBytesMax)
}

func (m *TokenChunk) DecodeMsgpack(d *msgpack.Decoder) error {
	const t = TypeTokenChunk
	return fields(d, t, tokenChunkKeys, func(i int) error {
		switch i {
		case 0:
			return readU64(d, t, "id", &m.RequestID)
		case 1:
			return readU32(d, t, "seq", &m.Seq)
		case 2:
			return readTokens(d, t, "tokens", ChunkTokensMax, &m.Tokens)
		default:
			return readString(d, t, "text", TextBytesMax, &m.Text)
		}
	})
}

// FinishReason says why generation stopped.
type FinishReason uint8

// Stable codes, like TypeCode and ErrorCode.
const (
	// FinishStop: the model produced its end-of-sequence token.
	FinishStop FinishReason = 1
	// FinishLength: MaxTokens tokens were generated.
	FinishLength FinishReason = 2
	// FinishError: no answer; GenerateResult.Err says why.
	FinishError FinishReason = 3
	// FinishStopSequence: the client asked the request to stop
	// (CancelRequest with CancelStop), having what it wants of the answer:
	// a stop sequence of its own came. Only a client that sent such a
	// CancelRequest, a version 2 one, is answered with it.
	FinishStopSequence FinishReason = 4
)

func (f FinishReason) String() string {
	switch f {
	case FinishStop:
		return "stop"
	case FinishLength:
		return "length"
	case FinishError:
		return "error"
	case FinishStopSequence:
		return "stop_sequence"
	}
	return fmt.Sprintf("finish(%d)", uint8(f))
}

// GenerateResult ends a request: the whole answer or an error, never both.
// It carries every token even when chunks were streamed, so a client can
// check the streamed answer against it.
type GenerateResult struct {
	RequestID uint64 `msgpack:"id"`
	// Tokens holds at most GenerateTokensMax token ids; none with an error.
	Tokens []uint32 `msgpack:"tokens,omitempty"`
	// Text is the detokenized answer, at most TextBytesMax bytes.
	Text         string       `msgpack:"text,omitempty"`
	FinishReason FinishReason `msgpack:"finish"`
	// Err is set exactly when FinishReason is FinishError.
	Err *WireError `msgpack:"err,omitempty"`
	// CachedTokens is how many of the prompt's tokens were not computed
	// for this request but read from the prefix cache of its scope.
	CachedTokens uint32 `msgpack:"cached_tokens,omitempty"`
}

var generateResultKeys = []string{"id", "tokens", "text", "finish", "err", "cached_tokens"}

func (*GenerateResult) TypeCode() TypeCode { return TypeGenerateResult }

func (m *GenerateResult) Validate() error {
	const t = TypeGenerateResult
	if err := checkRequestID(t, m.RequestID); err != nil {
		return err
	}
	if err := checkLen(t, "tokens", len(m.Tokens), GenerateTokensMax); err != nil {
		return err
	}
	if err := checkLen(t, "text", len(m.Text), TextBytesMax); err != nil {
		return err
	}
	switch m.FinishReason {
	case FinishStop, FinishLength, FinishStopSequence:
		if m.Err != nil {
			return &InvalidFieldError{t, "err", "set", fmt.Sprintf("nil with finish %s", m.FinishReason)}
		}
		return nil
	case FinishError:
		if m.Err == nil {
			return &InvalidFieldError{t, "err", "nil", "an error with finish error"}
		}
		// An error result carries no content: a partial answer next to an
		// error is how wrong answers reach users.
		if len(m.Tokens) != 0 || m.Text != "" {
			return &InvalidFieldError{t, "tokens", fmt.Sprintf("%d tokens and %d text bytes", len(m.Tokens), len(m.Text)), "none with an error"}
		}
		return m.Err.validate(t, "err")
	}
	return &InvalidFieldError{t, "finish", fmt.Sprint(uint8(m.FinishReason)), "1 (stop), 2 (length), 3 (error) or 4 (stop_sequence)"}
}

func (m *GenerateResult) DecodeMsgpack(d *msgpack.Decoder) error {
	const t = TypeGenerateResult
	return fields(d, t, generateResultKeys, func(i int) error {
		switch i {
		case 0:
			return readU64(d, t, "id", &m.RequestID)
		case 1:
			return readTokens(d, t, "tokens", GenerateTokensMax, &m.Tokens)
		case 2:
			return readString(d, t, "text", TextBytesMax, &m.Text)
		case 3:
			v, err := readUint(d, t, "finish", 255)
			m.FinishReason = FinishReason(v)
			return err
		case 4:
			var err error
			m.Err, err = readWireError(d, t, "err", true)
			return err
		default:
			return readU32(d, t, "cached_tokens", &m.CachedTokens)
		}
	})
}

// CancelReason says how a CancelRequest ends its request: a stable code,
// like FinishReason.
type CancelReason uint8

const (
	// CancelWithdraw: the client withdrew the request (it went away, or
	// its deadline passed); the request fails with CodeCancelled. The zero
	// value, and the only reason of a version 1 CancelRequest.
	CancelWithdraw CancelReason = 0
	// CancelStop: the client has what it wants of the answer (a stop
	// sequence of its own came): the request ends as completed with
	// FinishStopSequence and the tokens generated until the stop reached
	// it. Before its first token there is nothing to complete, and the
	// request is withdrawn as with CancelWithdraw.
	CancelStop CancelReason = 1
)

func (r CancelReason) String() string {
	switch r {
	case CancelWithdraw:
		return "withdraw"
	case CancelStop:
		return "stop"
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// CancelRequest asks to end a request early: to withdraw it, or to stop
// it as completed (Reason). It names the tenant too, so that the request
// actor can refuse a cancel from another tenant that guessed or reused the
// id.
//
// Its wire version depends on its reason: a withdrawal is encoded as
// version 1, byte for byte what builds before reasons existed send and
// decode, so that they still withdraw requests in a mixed cluster; a stop
// is version 2, which such a build refuses by its version (a VersionError,
// counted and logged there as an undecodable message) rather than taking it
// for a withdrawal or misreading it. The request then runs on there to its
// own end.
type CancelRequest struct {
	RequestID uint64       `msgpack:"id"`
	Tenant    string       `msgpack:"tenant"`
	Reason    CancelReason `msgpack:"reason,omitempty"`
}

var cancelRequestKeys = []string{"id", "tenant", "reason"}

func (*CancelRequest) TypeCode() TypeCode { return TypeCancelRequest }

// wireVersion is 1 for a withdrawal, 2 for a stop.
func (m *CancelRequest) wireVersion() uint8 {
	if m.Reason == CancelWithdraw {
		return 1
	}
	return 2
}

func (m *CancelRequest) Validate() error {
	const t = TypeCancelRequest
	if err := checkRequestID(t, m.RequestID); err != nil {
		return err
	}
	if m.Reason > CancelStop {
		return &InvalidFieldError{t, "reason", fmt.Sprint(uint8(m.Reason)), "0 (withdraw) or 1 (stop)"}
	}
	return checkTenant(t, m.Tenant)
}

func (m *CancelRequest) DecodeMsgpack(d *msgpack.Decoder) error {
	const t = TypeCancelRequest
	return fields(d, t, cancelRequestKeys, func(i int) error {
		switch i {
		case 0:
			return readU64(d, t, "id", &m.RequestID)
		case 1:
			return readString(d, t, "tenant", TenantBytesMax, &m.Tenant)
		default:
			v, err := readUint(d, t, "reason", 255)
			m.Reason = CancelReason(v)
			return err
		}
	})
}
