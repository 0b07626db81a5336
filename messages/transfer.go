package messages

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/kvwarden/kvwarden/kv"
	"github.com/vmihailenco/msgpack/v5"
)

// The prefill ↔ decode handshake (DESIGN.md): decode reserves destination
// pages and sends prefill a TransferPlan naming them; prefill streams the
// pages as kv frames (not these messages) to the plan's data plane, then
// sends TransferDone with the first generated token and its pages' seal
// checksums; when every page is
// sealed and the token count matches, decode sends TransferAck and only
// then does prefill release its pages. Either side may end the transfer
// with TransferAbort.
//
// RequestID and Tenant are the owner of the destination pages (kv.Owner):
// every message of the handshake names it, so that a late or misrouted
// message for another request or tenant is refused by the page checks.

// TransferPlan is decode's order to prefill: compute the KV of PromptTokens
// and write page i of it into DestTags[i].
type TransferPlan struct {
	RequestID uint64 `msgpack:"id"`
	Tenant    string `msgpack:"tenant"`
	// TokenCount is the number of prompt tokens, 1 to PromptTokensMax. It
	// repeats len(PromptTokens) on purpose: the two are checked against
	// each other on both sides of the wire.
	TokenCount uint32 `msgpack:"token_count"`
	// PromptTokens are the token ids decode tokenized, so that both sides
	// compute over exactly the same tokens.
	PromptTokens []uint32 `msgpack:"prompt_tokens"`
	// PageTokens is the page size both pools must share, 1 to PageTokensMax
	// tokens; prefill refuses a plan whose page size is not its own.
	PageTokens uint32 `msgpack:"page_tokens"`
	// DestTags are the reserved destination pages in token order:
	// ceil(TokenCount / PageTokens) distinct pages, at most PlanTagsMax.
	DestTags []kv.Tag `msgpack:"dest_tags"`
	// DataPlane is the host:port of decode's KV data plane, where prefill
	// sends the frames. Empty means decode is in the same process: the
	// frames go back as actor messages to the plan's sender.
	DataPlane string `msgpack:"data_plane,omitempty"`
	// Model is the fingerprint of the model decode computes, as
	// FingerprintDigits lowercase hexadecimal digits: prefill refuses a
	// plan for another model instead of sending KV that would decode
	// into a wrong answer.
	Model string `msgpack:"model"`
	// CacheSalt narrows the prefix cache scope prefill gives the plan's
	// tenant (GenerateRequest.CacheSalt).
	CacheSalt string `msgpack:"cache_salt,omitempty"`
	// HeldPages is how many of the prompt's first pages decode holds
	// already, read from its own prefix cache into the first DestTags:
	// prefill sends frames only for the pages after them. Fewer than the
	// prompt's pages: its last page is never cached.
	HeldPages uint32 `msgpack:"held_pages,omitempty"`
}

var transferPlanKeys = []string{"id", "tenant", "token_count", "prompt_tokens", "page_tokens", "dest_tags", "data_plane", "model", "cache_salt", "held_pages"}

func (*TransferPlan) TypeCode() TypeCode { return TypeTransferPlan }

// Owner is the owner of the destination pages.
func (m *TransferPlan) Owner() kv.Owner { return kv.Owner{Request: m.RequestID, Tenant: m.Tenant} }

func (m *TransferPlan) Validate() error {
	const t = TypeTransferPlan
	if err := checkOwner(t, m.RequestID, m.Tenant); err != nil {
		return err
	}
	if err := checkRange(t, "token_count", uint64(m.TokenCount), 1, PromptTokensMax); err != nil {
		return err
	}
	if len(m.PromptTokens) != int(m.TokenCount) {
		return &InvalidFieldError{t, "prompt_tokens", fmt.Sprintf("%d tokens", len(m.PromptTokens)), fmt.Sprintf("token_count (%d)", m.TokenCount)}
	}
	if err := checkRange(t, "page_tokens", uint64(m.PageTokens), 1, PageTokensMax); err != nil {
		return err
	}
	if err := checkLen(t, "dest_tags", len(m.DestTags), PlanTagsMax); err != nil {
		return err
	}
	pages := (int(m.TokenCount) + int(m.PageTokens) - 1) / int(m.PageTokens)
	if len(m.DestTags) != pages {
		return &InvalidFieldError{t, "dest_tags", fmt.Sprintf("%d tags", len(m.DestTags)),
			fmt.Sprintf("%d (%d tokens in pages of %d)", pages, m.TokenCount, m.PageTokens)}
	}
	if err := checkTags(t, "dest_tags", m.DestTags); err != nil {
		return err
	}
	if int(m.HeldPages) >= pages {
		return &InvalidFieldError{t, "held_pages", fmt.Sprint(m.HeldPages), fmt.Sprintf("below the prompt's %d pages", pages)}
	}
	if err := CheckFingerprint(t, "model", m.Model); err != nil {
		return err
	}
	if err := checkAddr(t, "data_plane", m.DataPlane, true); err != nil {
		return err
	}
	return checkCacheSalt(t, m.CacheSalt)
}

// FingerprintDigits is the length of a model fingerprint in hexadecimal
// digits (16 bytes).
const FingerprintDigits = 32

// CheckFingerprint refuses a model fingerprint that is not
// FingerprintDigits lowercase hexadecimal digits.
func CheckFingerprint(t TypeCode, field, fp string) error {
	ok := len(fp) == FingerprintDigits
	for i := 0; ok && i < len(fp); i++ {
		ok = '0' <= fp[i] && fp[i] <= '9' || 'a' <= fp[i] && fp[i] <= 'f'
	}
	if !ok {
		return &InvalidFieldError{t, field, fmt.Sprintf("%q", fp), fmt.Sprintf("%d lowercase hexadecimal digits", FingerprintDigits)}
	}
	return nil
}

// checkTags refuses the zero incarnation and generation (kv starts both at
// 1) and a physical page named twice, which would make two token ranges
// share one page.
func checkTags(t TypeCode, field string, tags []kv.Tag) error {
	for i, tag := range tags {
		if tag.Incarnation == 0 || tag.Generation == 0 {
			return &InvalidFieldError{t, fmt.Sprintf("%s[%d]", field, i), tag.String(), "non-zero incarnation and generation"}
		}
	}
	type page struct {
		inc uint64
		idx uint32
	}
	pages := make([]page, len(tags))
	for i, tag := range tags {
		pages[i] = page{tag.Incarnation, tag.Index}
	}
	slices.SortFunc(pages, func(a, b page) int {
		return cmp.Or(cmp.Compare(a.inc, b.inc), cmp.Compare(a.idx, b.idx))
	})
	for i := 1; i < len(pages); i++ {
		if pages[i] == pages[i-1] {
			return &InvalidFieldError{t, field, fmt.Sprintf("page %x/%d named twice", pages[i].inc, pages[i].idx), "distinct pages"}
		}
	}
	return nil
}

func (m *TransferPlan) DecodeMsgpack(d *msgpack.Decoder) error {
	const t = TypeTransferPlan
	return fields(d, t, transferPlanKeys, func(i int) error {
		switch i {
		case 0:
			return readU64(d, t, "id", &m.RequestID)
		case 1:
			return readString(d, t, "tenant", TenantBytesMax, &m.Tenant)
		case 2:
			return readU32(d, t, "token_count", &m.TokenCount)
		case 3:
			return readTokens(d, t, "prompt_tokens", PromptTokensMax, &m.PromptTokens)
		case 4:
			return readU32(d, t, "page_tokens", &m.PageTokens)
		case 5:
			return readTags(d, t, "dest_tags", PlanTagsMax, &m.DestTags)
		case 6:
			return readString(d, t, "data_plane", AddrBytesMax, &m.DataPlane)
		case 7:
			return readString(d, t, "model", FingerprintDigits, &m.Model)
		case 8:
			return readString(d, t, "cache_salt", kv.CacheSaltBytesMax, &m.CacheSalt)
		default:
			return readU32(d, t, "held_pages", &m.HeldPages)
		}
	})
}

// TransferDone is prefill's word that it sent every frame of a plan, or
// that it failed. Decode still checks the pages before it acks: the frames
// may be in flight, and a count is no checksum. Sums carry prefill's seal
// of every page to decode, which seals a received page only if its bytes
// hash to the same sum (kv.Page.SealFrom): a page changed between prefill's
// seal and its send passes every frame checksum, computed at the send, and
// is caught there.
type TransferDone struct {
	RequestID uint64 `msgpack:"id"`
	Tenant    string `msgpack:"tenant"`
	// First is the first generated token, greedy from the prompt's last
	// position; decode continues from it.
	First uint32 `msgpack:"first"`
	// Frames is how many frames prefill sent, at least 1.
	Frames uint32 `msgpack:"frames"`
	// Source is the request id prefill's own pages were owned by (the
	// owner of the source pages, with Tenant): their seal checksums cover
	// it. Non-zero without an error.
	Source uint64 `msgpack:"source,omitempty"`
	// Sums are the seal checksums of the source pages prefill sent, in
	// the plan's page order: 1 to PlanTagsMax of them (decode wants
	// exactly its plan's pages after the held ones) without an error,
	// none with one.
	Sums []uint64 `msgpack:"sums,omitempty"`
	// Err says why prefill failed; First, Frames and Source are then 0.
	Err *WireError `msgpack:"err,omitempty"`
	// Cached is how many of the prompt's first tokens prefill read from
	// its prefix cache instead of computing them: whole pages, fewer than
	// the plan's token count; 0 with an error.
	Cached uint32 `msgpack:"cached,omitempty"`
	// HeldSums are the kv.ContentChecksum of the rows prefill computed for
	// each page the plan said decode holds (TransferPlan.HeldPages), in
	// order: decode refuses held pages whose rows are not those, so that
	// what one prefill node computed is never answered from under another
	// one's request. At most PlanTagsMax with Sums; none with an error.
	HeldSums []uint64 `msgpack:"held_sums,omitempty"`
}

var transferDoneKeys = []string{"id", "tenant", "first", "frames", "source", "sums", "err", "cached", "held_sums"}

func (*TransferDone) TypeCode() TypeCode { return TypeTransferDone }

// Owner is the owner of the destination pages.
func (m *TransferDone) Owner() kv.Owner { return kv.Owner{Request: m.RequestID, Tenant: m.Tenant} }

// SourceOwner is the owner of prefill's source pages.
func (m *TransferDone) SourceOwner() kv.Owner { return kv.Owner{Request: m.Source, Tenant: m.Tenant} }

func (m *TransferDone) Validate() error {
	const t = TypeTransferDone
	if err := checkOwner(t, m.RequestID, m.Tenant); err != nil {
		return err
	}
	if err := checkLen(t, "sums", len(m.Sums), PlanTagsMax); err != nil {
		return err
	}
	// A plan's pages are held or sent: PlanTagsMax of both together.
	if err := checkLen(t, "held_sums", len(m.HeldSums), PlanTagsMax-len(m.Sums)); err != nil {
		return err
	}
	if m.Err == nil {
		switch {
		case m.Frames == 0:
			return &InvalidFieldError{t, "frames", "0", "at least 1 without an error"}
		case m.Source == 0:
			return &InvalidFieldError{t, "source", "0", "a non-zero request id without an error"}
		case len(m.Sums) == 0:
			return &InvalidFieldError{t, "sums", "none", "a checksum per page without an error"}
		}
		return nil
	}
	// A failed prefill has no first token: one next to an error is how
	// wrong answers reach users.
	for _, f := range []struct {
		name string
		v    uint64
	}{{"first", uint64(m.First)}, {"frames", uint64(m.Frames)}, {"source", m.Source}, {"sums", uint64(len(m.Sums))}, {"cached", uint64(m.Cached)},
		{"held_sums", uint64(len(m.HeldSums))}} {
		if f.v != 0 {
			return &InvalidFieldError{t, f.name, fmt.Sprint(f.v), "0 with an error"}
		}
	}
	return m.Err.validate(t, "err")
}

func (m *TransferDone) DecodeMsgpack(d *msgpack.Decoder) error {
	const t = TypeTransferDone
	return fields(d, t, transferDoneKeys, func(i int) error {
		switch i {
		case 0:
			return readU64(d, t, "id", &m.RequestID)
		case 1:
			return readString(d, t, "tenant", TenantBytesMax, &m.Tenant)
		case 2:
			return readU32(d, t, "first", &m.First)
		case 3:
			return readU32(d, t, "frames", &m.Frames)
		case 4:
			return readU64(d, t, "source", &m.Source)
		case 5:
			return readSlice(d, t, "sums", PlanTagsMax, &m.Sums, func(v *uint64) error {
				return readU64(d, t, "sums", v)
			})
		case 6:
			var err error
			m.Err, err = readWireError(d, t, "err", true)
			return err
		case 7:
			return readU32(d, t, "cached", &m.Cached)
		default:
			return readSlice(d, t, "held_sums", PlanTagsMax, &m.HeldSums, func(v *uint64) error {
				return readU64(d, t, "held_sums", v)
			})
		}
	})
}

// TransferAck is decode's word that every destination page is sealed with a
// matching checksum and the token count matches the plan: prefill may now
// release its own pages.
type TransferAck struct {
	RequestID uint64 `msgpack:"id"`
	Tenant    string `msgpack:"tenant"`
	// TokenCount and Pages repeat the plan's figures, so that prefill checks
	// that the ack is for the plan it executed.
	TokenCount uint32 `msgpack:"token_count"`
	Pages      uint32 `msgpack:"pages"`
}

var transferAckKeys = []string{"id", "tenant", "token_count", "pages"}

func (*TransferAck) TypeCode() TypeCode { return TypeTransferAck }

// Owner is the owner of the destination pages.
func (m *TransferAck) Owner() kv.Owner { return kv.Owner{Request: m.RequestID, Tenant: m.Tenant} }

func (m *TransferAck) Validate() error {
	const t = TypeTransferAck
	if err := checkOwner(t, m.RequestID, m.Tenant); err != nil {
		return err
	}
	if err := checkRange(t, "token_count", uint64(m.TokenCount), 1, PromptTokensMax); err != nil {
		return err
	}
	return checkRange(t, "pages", uint64(m.Pages), 1, PlanTagsMax)
}

func (m *TransferAck) DecodeMsgpack(d *msgpack.Decoder) error {
	const t = TypeTransferAck
	return fields(d, t, transferAckKeys, func(i int) error {
		switch i {
		case 0:
			return readU64(d, t, "id", &m.RequestID)
		case 1:
			return readString(d, t, "tenant", TenantBytesMax, &m.Tenant)
		case 2:
			return readU32(d, t, "token_count", &m.TokenCount)
		default:
			return readU32(d, t, "pages", &m.Pages)
		}
	})
}

// TransferAbort ends a transfer from either side; each releases its pages
// (decode's deferred until its reclaim deadline, so that late frames meet a
// new generation).
type TransferAbort struct {
	RequestID uint64    `msgpack:"id"`
	Tenant    string    `msgpack:"tenant"`
	Reason    WireError `msgpack:"reason"`
}

var transferAbortKeys = []string{"id", "tenant", "reason"}

func (*TransferAbort) TypeCode() TypeCode { return TypeTransferAbort }

// Owner is the owner of the destination pages.
func (m *TransferAbort) Owner() kv.Owner { return kv.Owner{Request: m.RequestID, Tenant: m.Tenant} }

func (m *TransferAbort) Validate() error {
	const t = TypeTransferAbort
	if err := checkOwner(t, m.RequestID, m.Tenant); err != nil {
		return err
	}
	return m.Reason.validate(t, "reason")
}

func (m *TransferAbort) DecodeMsgpack(d *msgpack.Decoder) error {
	const t = TypeTransferAbort
	return fields(d, t, transferAbortKeys, func(i int) error {
		switch i {
		case 0:
			return readU64(d, t, "id", &m.RequestID)
		case 1:
			return readString(d, t, "tenant", TenantBytesMax, &m.Tenant)
		default:
			e, err := readWireError(d, t, "reason", false)
			if e != nil {
				m.Reason = *e
			}
			return err
		}
	})
}
