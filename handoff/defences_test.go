package handoff

// Each check of a Request on its own: the machine stepped directly, its
// effects answered by the test, with no pool, engine or later layer (the
// pages' seal against prefill's checksums, the manifest's verification,
// the decode worker's first-token check) to refuse in its place. A check
// that only a later layer backs up passes every end-to-end test with the
// check gone; here its absence fails.

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
)

// fataler is a *testing.T or a *rapid.T.
type fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

// lonePageTokens is the page size of a lone request's pool.
const lonePageTokens = 4

// lone is one Request of a decode node stepped by the test alone, from its
// start to its plan: its destination pages reserved (tags of generation 1
// from index 0) and its plan out to the prefill peer of run prefillInc.
type lone struct {
	t      fataler
	r      *Request
	now    time.Time
	dest   []kv.Tag
	owner  kv.Owner
	prompt int
}

func newLone(t fataler, promptTokens, maxNew int) *lone {
	t.Helper()
	g := tinyModel().Geometry(lonePageTokens)
	cfg := RequestConfig{Geometry: g, Incarnation: decodeInc, DataPlane: "decode:1",
		RequestTimeout: time.Minute, PrefillTimeout: 10 * time.Second, ReserveWait: time.Second,
		ReserveRetry: 10 * time.Millisecond, RetriesMax: RetriesMax, EOS: 0, Model: testModel.String()}
	prompt := make([]int, promptTokens)
	for i := range prompt {
		prompt[i] = 'a' + i%26
	}
	l := &lone{t: t, now: time.Unix(1_000_000, 0), owner: kv.Owner{Request: 1, Tenant: "acme"}, prompt: promptTokens}
	l.r = NewRequest(cfg, l.owner, 7, prompt, maxNew, Peer{Address: "prefill:1", Incarnation: prefillInc})
	res, ok := find[Reserve](l.step(Start{}))
	if !ok || res.Prompt != g.PagesFor(promptTokens) {
		t.Fatalf("start of a %d-token request: %+v", promptTokens, res)
	}
	for i := range res.Prompt {
		l.dest = append(l.dest, kv.Tag{Incarnation: decodeInc, Index: uint32(i), Generation: 1})
	}
	spare := make([]kv.Tag, res.Spare)
	for i := range spare {
		spare[i] = kv.Tag{Incarnation: decodeInc, Index: uint32(res.Prompt + i), Generation: 1}
	}
	if _, ok := find[SendPlan](l.step(Reserved{Dest: l.dest, Spare: spare})); !ok {
		t.Fatalf("no plan after the reservation")
	}
	return l
}

func (l *lone) step(ev Event) []Effect { return l.r.Step(ev, l.now) }

// frame is a frame of tokens tokens for destination page i, from source
// page i of the planned peer, as the request's owner.
func (l *lone) frame(i, tokens int) kv.Frame {
	return kv.Frame{Owner: l.owner, Source: kv.Tag{Incarnation: prefillInc, Index: uint32(i), Generation: 1},
		Dest: l.dest[i], FirstToken: i * lonePageTokens, Tokens: tokens, Payload: []byte{1}}
}

// transfer hands the request frames, has them all written, and steps the
// TransferDone done; it returns the effects of that last step.
func (l *lone) transfer(frames []kv.Frame, done *messages.TransferDone) []Effect {
	l.t.Helper()
	if len(frames) > 0 {
		if _, ok := only[Write](l.step(FramesIn{Frames: frames})); !ok {
			l.t.Fatalf("frames %+v not written", frames)
		}
		if eff := l.step(Written{N: len(frames)}); len(eff) != 0 {
			l.t.Fatalf("written frames: %+v", eff)
		}
	}
	return l.step(TransferIn{Done: done, FromPrefill: true})
}

// done is prefill's report of a successful transfer of frames frames with
// sums seal checksums.
func (l *lone) done(frames uint32, sums int) *messages.TransferDone {
	return &messages.TransferDone{RequestID: l.owner.Request, Tenant: l.owner.Tenant, First: 5, Frames: frames,
		Source: 1, Sums: make([]uint64, sums)}
}

// only is the one effect of eff, if it is one of type T.
func only[T Effect](eff []Effect) (T, bool) {
	var zero T
	if len(eff) != 1 {
		return zero, false
	}
	e, ok := eff[0].(T)
	return e, ok
}

// find is the first effect of eff of type T.
func find[T Effect](eff []Effect) (T, bool) {
	for _, e := range eff {
		if x, ok := e.(T); ok {
			return x, true
		}
	}
	var zero T
	return zero, false
}

// failedWith checks that eff ends the request, before any page was sealed,
// with an error like want (errors.As into its type, then compared), told
// to the client as code; the prefill peer is told, and every destination
// page is released.
func (l *lone) failedWith(eff []Effect, want error, code messages.ErrorCode) {
	l.t.Helper()
	fin, ok := find[Finish](eff)
	if !ok || fin.Cause == nil {
		l.t.Fatalf("effects %+v: want the request to fail with %v", eff, want)
	}
	got := fin.Cause
	switch w := want.(type) {
	case *kv.ManifestError:
		var me *kv.ManifestError
		if !errors.As(got, &me) || *me != *w {
			l.t.Fatalf("failed with %v, want %v", got, want)
		}
	case *kv.WrongOwnerError:
		var wo *kv.WrongOwnerError
		if !errors.As(got, &wo) || *wo != *w {
			l.t.Fatalf("failed with %v, want %v", got, want)
		}
	case *StrangerError:
		var se *StrangerError
		if !errors.As(got, &se) || *se != *w {
			l.t.Fatalf("failed with %v, want %v", got, want)
		}
	default:
		l.t.Fatalf("failedWith does not know %T", want)
	}
	if fin.Result.Err == nil || fin.Result.Err.Code != code {
		l.t.Fatalf("told the client %+v, want %s", fin.Result.Err, code)
	}
	if _, written := find[Write](eff); written {
		l.t.Fatalf("frames written although the request failed: %+v", eff)
	}
	if _, sealed := find[SealVerify](eff); sealed {
		l.t.Fatalf("pages sealed although the request failed: %+v", eff)
	}
	if _, told := find[SendAbort](eff); !told {
		l.t.Fatalf("the prefill peer is not told: %+v", eff)
	}
	if rel, ok := find[Release](eff); !ok || fmt.Sprint(rel.Tags) != fmt.Sprint(l.dest) {
		l.t.Fatalf("destination pages %v not released: %+v", l.dest, eff)
	}
	if !l.r.Done() {
		l.t.Fatalf("the request is not done")
	}
}

// TestTransferDoneMustCoverThePrompt: prefill's TransferDone is taken only
// when the frames written are the ones it counts and hold every token of
// the prompt, and it carries a checksum for every page; otherwise the
// request fails with the numbers before any page is sealed. A report with
// the right frame count over fewer tokens is refused here, not left to the
// seal or the manifest's verification.
func TestTransferDoneMustCoverThePrompt(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tokens []int  // per destination page, the tokens of its frame (0: no frame)
		frames uint32 // the frame count the TransferDone reports
		sums   int
		want   error // nil: sealed
	}{
		{"every token", []int{4, 4, 2}, 3, 3, nil},
		{"the last page short, the count right", []int{4, 4, 1}, 3, 3,
			&kv.ManifestError{Field: "tokens transferred", Page: -1, Want: 10, Have: 9}},
		{"a page short, the count right", []int{4, 3, 2}, 3, 3,
			&kv.ManifestError{Field: "tokens transferred", Page: -1, Want: 10, Have: 9}},
		{"a page without a frame, counted as sent", []int{4, 0, 2}, 2, 3,
			&kv.ManifestError{Field: "tokens transferred", Page: -1, Want: 10, Have: 6}},
		{"no frame at all", []int{0, 0, 0}, 0, 3,
			&kv.ManifestError{Field: "tokens transferred", Page: -1, Want: 10, Have: 0}},
		{"more frames counted than came", []int{4, 4, 2}, 4, 3,
			&kv.ManifestError{Field: "tokens transferred", Page: -1, Want: 10, Have: 10}},
		{"fewer frames counted than came", []int{4, 4, 2}, 2, 3,
			&kv.ManifestError{Field: "tokens transferred", Page: -1, Want: 10, Have: 10}},
		{"a checksum missing", []int{4, 4, 2}, 3, 2,
			&kv.ManifestError{Field: "source checksums", Page: -1, Want: 3, Have: 2}},
		{"a checksum too many", []int{4, 4, 2}, 3, 4,
			&kv.ManifestError{Field: "source checksums", Page: -1, Want: 3, Have: 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLone(t, 10, 4)
			var frames []kv.Frame
			for i, n := range tc.tokens {
				if n > 0 {
					frames = append(frames, l.frame(i, n))
				}
			}
			eff := l.transfer(frames, l.done(tc.frames, tc.sums))
			if tc.want != nil {
				l.failedWith(eff, tc.want, messages.CodeIntegrity)
				return
			}
			sv, ok := only[SealVerify](eff)
			if !ok || len(sv.Origins) != 3 || sv.Manifest.Tokens != 10 {
				t.Fatalf("a whole transfer: %+v, want its 3 pages sealed and verified", eff)
			}
			for i, o := range sv.Origins {
				if o.Tag != frames[i].Source || o.Owner != (kv.Owner{Request: 1, Tenant: "acme"}) {
					t.Fatalf("page %d sealed against %+v, its frame came from %s", i, o, frames[i].Source)
				}
			}
		})
	}
}

// TestTransferDoneProperty: against a naive model, a TransferDone leads to
// sealing exactly when the frames written are as many as it counts, hold
// the prompt's every token, and it has one checksum per page; else the
// request fails, sealing nothing.
func TestTransferDoneProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		prompt := rapid.IntRange(1, 40).Draw(rt, "prompt")
		l := newLone(rt, prompt, 2)
		var frames []kv.Frame
		written := 0
		for i := range l.dest {
			full := min(lonePageTokens, prompt-i*lonePageTokens)
			n := rapid.IntRange(0, full).Draw(rt, fmt.Sprintf("tokens of page %d", i))
			if n > 0 {
				frames = append(frames, l.frame(i, n))
				written += n
			}
		}
		count := max(0, len(frames)+rapid.IntRange(-1, 1).Draw(rt, "frames miscounted by"))
		sums := max(0, len(l.dest)+rapid.IntRange(-1, 1).Draw(rt, "checksums miscounted by"))
		eff := l.transfer(frames, l.done(uint32(count), sums))
		whole := count == len(frames) && written == prompt && sums == len(l.dest)
		_, sealed := only[SealVerify](eff)
		fin, failed := find[Finish](eff)
		switch {
		case whole && !sealed:
			rt.Fatalf("a whole transfer of %d tokens in %d frames not sealed: %+v", prompt, count, eff)
		case !whole && (sealed || !failed || fin.Cause == nil):
			rt.Fatalf("%d of %d tokens in %d frames (%d counted), %d checksums for %d pages: %+v",
				written, prompt, len(frames), count, sums, len(l.dest), eff)
		}
	})
}

// TestFramesOutsideThePlanFailTheRequest: a frame the request did not plan
// for (another request's or tenant's, from a page of another run of the
// peer, past the prompt's pages, or a second source page for one
// destination) fails the request before anything is written. The pool
// would refuse some of them too; the request must not rely on it.
func TestFramesOutsideThePlanFailTheRequest(t *testing.T) {
	planned := fmt.Sprintf("prefill:1 (incarnation %x)", prefillInc)
	for _, tc := range []struct {
		name    string
		earlier []int // pages whose frames were written before
		frames  func(l *lone) []kv.Frame
		want    error
	}{
		{"another request's frame", nil, func(l *lone) []kv.Frame {
			f := l.frame(0, 4)
			f.Owner = kv.Owner{Request: 9, Tenant: "globex"}
			return []kv.Frame{f}
		}, &kv.WrongOwnerError{Page: kv.Tag{Incarnation: decodeInc, Index: 0, Generation: 1}, Owner: 1, Have: 9}},
		{"its request id, another tenant", nil, func(l *lone) []kv.Frame {
			f := l.frame(1, 4)
			f.Owner.Tenant = "globex"
			return []kv.Frame{l.frame(0, 4), f}
		}, &kv.WrongOwnerError{Page: kv.Tag{Incarnation: decodeInc, Index: 1, Generation: 1}, Owner: 1, Have: 1}},
		{"a page of another run of the peer", nil, func(l *lone) []kv.Frame {
			f := l.frame(0, 4)
			f.Source.Incarnation = prefillInc + 1
			return []kv.Frame{f}
		}, &StrangerError{What: "frames", From: fmt.Sprintf("a page of incarnation %x", prefillInc+1), Planned: planned}},
		{"past the prompt's last page", nil, func(l *lone) []kv.Frame {
			f := l.frame(2, 2)
			f.FirstToken = 3 * lonePageTokens
			return []kv.Frame{f}
		}, &kv.ManifestError{Field: "first position of a frame", Page: -1, Want: 2 * lonePageTokens, Have: 3 * lonePageTokens}},
		{"from inside a page", nil, func(l *lone) []kv.Frame {
			f := l.frame(1, 3)
			f.FirstToken++
			return []kv.Frame{f}
		}, &kv.ManifestError{Field: "first position of a frame", Page: -1, Want: lonePageTokens, Have: lonePageTokens + 1}},
		{"two source pages for one destination", nil, func(l *lone) []kv.Frame {
			f := l.frame(0, 4)
			f.Source.Index = 7
			return []kv.Frame{l.frame(0, 4), f}
		}, &kv.ManifestError{Field: "source pages", Page: 0, Want: 1, Have: 2}},
		{"another source page for a page written before", []int{0, 1}, func(l *lone) []kv.Frame {
			f := l.frame(1, 4)
			f.Source.Index = 7
			return []kv.Frame{f}
		}, &kv.ManifestError{Field: "source pages", Page: 1, Want: 1, Have: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLone(t, 10, 4)
			for _, i := range tc.earlier {
				l.step(FramesIn{Frames: []kv.Frame{l.frame(i, 4)}})
				l.step(Written{N: 1})
			}
			eff := l.step(FramesIn{Frames: tc.frames(l)})
			if _, written := find[Write](eff); written {
				t.Fatalf("frames outside the plan written: %+v", eff)
			}
			l.failedWith(eff, tc.want, messages.CodeIntegrity)
			if _, isStranger := tc.want.(*StrangerError); isStranger {
				if ref, ok := find[Refuse](eff); !ok || *ref.Err != *tc.want.(*StrangerError) {
					t.Fatalf("frames of another run not counted as a stranger's: %+v", eff)
				}
			}
		})
	}
}

// TestOthersCannotEndTheRequest: what anyone but the planned peer sends
// for the current attempt (frames the transport did not prove to be the
// peer's, a TransferDone from another sender), a loss of another node, the
// deadline of an earlier attempt and frames of an abandoned attempt change
// nothing: the request goes on, and the planned peer's transfer is sealed
// when it comes. Request ids are no secret, so a stranger must not be able
// to end a request by naming it.
func TestOthersCannotEndTheRequest(t *testing.T) {
	planned := fmt.Sprintf("prefill:1 (incarnation %x)", prefillInc)
	for _, tc := range []struct {
		name   string
		ev     func(l *lone) Event
		refuse *StrangerError // nil: no effect at all
	}{
		{"frames from a stranger", func(l *lone) Event {
			return FramesIn{Frames: []kv.Frame{l.frame(0, 4)}, Stranger: true, From: "mallory:1"}
		}, &StrangerError{What: "frames", From: "mallory:1", Planned: planned}},
		{"a stranger's TransferDone", func(l *lone) Event {
			return TransferIn{Done: l.done(3, 3), From: "mallory:1"}
		}, &StrangerError{What: "transfer done", From: "mallory:1", Planned: planned}},
		{"a stranger's failed TransferDone", func(l *lone) Event {
			d := l.done(0, 0)
			d.Err = &messages.WireError{Code: messages.CodeIntegrity, Message: "made up"}
			return TransferIn{Done: d, From: "mallory:1"}
		}, &StrangerError{What: "transfer done", From: "mallory:1", Planned: planned}},
		{"another node lost", func(*lone) Event { return PeerLost{Incarnation: prefillInc + 1} }, nil},
		{"an earlier attempt's deadline", func(*lone) Event { return PrefillDeadline{Attempt: 0} }, nil},
		{"frames of an abandoned attempt", func(l *lone) Event {
			f := l.frame(0, 4)
			f.Owner.Request = 0
			return FramesIn{Frames: []kv.Frame{f}}
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLone(t, 10, 4)
			eff := l.step(tc.ev(l))
			switch ref, ok := only[Refuse](eff); {
			case tc.refuse == nil && len(eff) != 0:
				t.Fatalf("effects %+v, want none", eff)
			case tc.refuse != nil && (!ok || *ref.Err != *tc.refuse):
				t.Fatalf("effects %+v, want only the refusal %v", eff, tc.refuse)
			case l.r.Done():
				t.Fatal("the request ended")
			}
			frames := []kv.Frame{l.frame(0, 4), l.frame(1, 4), l.frame(2, 2)}
			if _, ok := only[SealVerify](l.transfer(frames, l.done(3, 3))); !ok {
				t.Fatal("the planned peer's transfer was not sealed after it")
			}
		})
	}
}

// TestThePeersLossAndDeadlineRetry: the loss of the planned peer's run, or
// the current attempt's deadline, has the request look for another peer.
func TestThePeersLossAndDeadlineRetry(t *testing.T) {
	for _, ev := range []Event{PeerLost{Incarnation: prefillInc}, PrefillDeadline{Attempt: 1}} {
		l := newLone(t, 10, 4)
		pick, ok := only[Pick](l.step(ev))
		if !ok || !pick.Exclude[prefillInc] {
			t.Fatalf("%T%+v: want a Pick excluding the peer", ev, ev)
		}
	}
}
