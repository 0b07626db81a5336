package actors

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/trust"
)

// TestIntegrityOf names every refusal by the check that made it, through
// wrapping and joining, and leaves a peer's report (counted where it was
// detected) and other failures alone.
func TestIntegrityOf(t *testing.T) {
	stale := &kv.StaleTagError{Page: 3}
	for _, tc := range []struct {
		err  error
		want IntegrityReason
	}{
		{stale, IntegrityStaleTag},
		{fmt.Errorf("writing: %w", &kv.WrongOwnerError{Owner: 1, Have: 2}), IntegrityWrongOwner},
		{&kv.WrongTenantError{Owner: "acme", Have: "globex"}, IntegrityWrongTenant},
		{errors.Join(errors.New("seal"), &kv.ChecksumMismatchError{Where: "seal"}), IntegrityChecksum},
		{&kv.ManifestError{Field: "tokens transferred"}, IntegrityManifest},
		{&engine.FingerprintError{}, IntegrityFingerprint},
		{&kv.StateError{Op: "write"}, IntegrityState},
		{&kv.TokenRangeError{}, IntegrityTokenRange},
		{&kv.FrameError{Field: "tokens"}, IntegrityFrame},
		// The first token is the check that failed, whatever the
		// recomputation met.
		{&handoff.FirstTokenError{Err: stale}, IntegrityFirstToken},
	} {
		if got, ok := IntegrityOf(tc.err); !ok || got != tc.want {
			t.Errorf("IntegrityOf(%v) = %s %v, want %s", tc.err, integrityNames[got], ok, integrityNames[tc.want])
		}
	}
	for _, err := range []error{&messages.WireError{Code: messages.CodeIntegrity}, handoff.ErrCancelled,
		&kv.PoolExhaustedError{}, errors.New("other")} {
		if r, ok := IntegrityOf(err); ok {
			t.Errorf("IntegrityOf(%v) = %s, want none", err, integrityNames[r])
		}
	}
	if len(IntegrityReasonNames()) != int(integrityReasons) || slices.Contains(IntegrityReasonNames(), "") {
		t.Fatalf("names %v", IntegrityReasonNames())
	}
}

// TestRejectBoundOf names the bound of every refusal admission's rules
// make, as they make them.
func TestRejectBoundOf(t *testing.T) {
	cfg := testConfig()
	l := cfg.Limits()
	long := strings.Repeat("x", 4*cfg.ContextTokens)
	_, encodeErr := handoff.Encode(l, withModel(t, cfg, Options{}).Model.Tokenizer(), long, false)
	admission := func(queueMax int, prep func(*handoff.Admission), q handoff.Ask) error {
		a := handoff.NewAdmission(l, queueMax, 1, cfg.DecodePages)
		prep(a)
		_, err := a.Admit(q)
		return err
	}
	ask := handoff.Ask{Key: handoff.ClientKey{Client: "c", ID: 1}, PromptTokens: 10, MaxTokens: 4}
	for _, tc := range []struct {
		name string
		err  error
		want RejectBound
	}{
		{"unencoded", encodeErr, RejectContextWindow},
		{"context window", handoff.Admit(l, cfg.ContextTokens+1, 1, cfg.PrefillPages, cfg.DecodePages), RejectContextWindow},
		{"prompt and max_tokens", handoff.Admit(l, cfg.ContextTokens-1, 2, cfg.PrefillPages, cfg.DecodePages), RejectContextWindow},
		{"prefill pool", handoff.Admit(l, 100, 1, 2, cfg.DecodePages), RejectPrefillPool},
		{"decode pool", handoff.Admit(l, 100, 1, cfg.PrefillPages, 2), RejectDecodePool},
		{"max_tokens", handoff.Admit(l, 10, 0, cfg.PrefillPages, cfg.DecodePages), RejectBadRequest},
		{"draining", admission(1, (*handoff.Admission).Drain, ask), RejectDraining},
		{"no prefill", admission(1, func(*handoff.Admission) {}, handoff.Ask{Key: ask.Key, PromptTokens: 10, MaxTokens: 4, NoPrefill: true}),
			RejectNoPeer},
		{"queue", admission(1, func(a *handoff.Admission) { a.Started("r", handoff.ClientKey{Client: "c", ID: 2}, 0) }, ask),
			RejectQueue},
		{"duplicate", admission(2, func(a *handoff.Admission) { a.Started("r", ask.Key, 0) }, ask), RejectBadRequest},
		{"router queue", &BusyError{Where: "router", Have: 64, Limit: 64}, RejectQueue},
		{"draining router", &BusyError{Where: "draining router"}, RejectDraining},
		{"no decode node", &UnavailableError{Roles: []string{"decode"}, Seen: "0 decode and 1 prefill nodes"}, RejectNoPeer},
		{"forbidden", &ForbiddenError{Sender: "x", Reason: "y"}, RejectForbidden},
		{"old incarnation", &messages.WireError{Code: messages.CodeNodeLost}, RejectIncarnation},
		{"invalid field", &messages.InvalidFieldError{Type: messages.TypeRoutedRequest, Field: "prefill"}, RejectBadRequest},
		{"unknown bound", &BusyError{Where: "somewhere new"}, RejectOther},
		{"internal", errors.New("spawning failed"), RejectOther},
	} {
		if tc.err == nil {
			t.Fatalf("%s: no refusal", tc.name)
		}
		if got := RejectBoundOf(tc.err); got != tc.want {
			t.Errorf("%s (%v): bound %s, want %s", tc.name, tc.err, rejectNames[got], rejectNames[tc.want])
		}
	}
}

// TestTransferFailureCode: a send out of time is a lost receiver, a
// withdrawn one cancelled, anything else the code its request is told.
func TestTransferFailureCode(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want messages.ErrorCode
	}{
		{fmt.Errorf("send: %w", context.DeadlineExceeded), messages.CodeNodeLost},
		{fmt.Errorf("send: %w", context.Canceled), messages.CodeCancelled},
		{&messages.WireError{Code: messages.CodeBusy}, messages.CodeBusy},
		{fmt.Errorf("batch refused: %w", kv.ErrRefused), messages.CodeIntegrity},
	} {
		if got := TransferFailureCode(tc.err); got != tc.want {
			t.Errorf("TransferFailureCode(%v) = %s, want %s", tc.err, got, tc.want)
		}
	}
}

// TestNodeMetrics: in a node of role all, three requests are three
// transfers on each side, of exactly their prompts' pages and KV bytes;
// every request ends in no stage; a forged batch of another request's and
// one of a request that is not here, and a plan of another model, are
// refused and counted by reason, once each.
func TestNodeMetrics(t *testing.T) {
	cfg := testConfig()
	n := startNode(t, cfg)
	g := cfg.Geometry()
	c := localClient(n)
	pages, bytes := 0, 0
	for _, prompt := range []string{"one", strings.Repeat("a page and more ", 3), strings.Repeat("z", 2*g.PageTokens-1)} {
		if _, err := c.Generate(context.Background(), "acme", prompt, client.GenerateOptions{MaxTokens: 3}, nil); err != nil {
			t.Fatal(err)
		}
		tokens, err := handoff.Encode(cfg.Limits(), n.Model().Tokenizer(), prompt, false)
		if err != nil {
			t.Fatal(err)
		}
		pages += g.PagesFor(len(tokens))
		bytes += len(tokens) * g.BytesPerToken()
	}
	m := n.Metrics()
	for _, side := range []struct {
		name string
		s    TransferStats
	}{{"sent", m.Sent}, {"received", m.Received}} {
		if s := side.s; s.Transfers != 3 || s.Pages != uint64(pages) || s.Bytes != uint64(bytes) || len(s.FailedByCode) != 0 ||
			s.Duration.Sum <= 0 || sum(s.Duration.Counts) != 3 {
			t.Errorf("%s: %+v, want 3 transfers of %d pages and %d bytes, none failed", side.name, s, pages, bytes)
		}
	}
	if m.WaitingPages != 0 || m.WaitingKV != 0 || m.Running != 0 {
		t.Errorf("after the requests ended: %+v", m)
	}
	// The prefill worker counts its queue after the step that answered
	// the plan, which may come after the client has its answer.
	testwait.For(t, "every plan out of the queue and acknowledged", time.Minute, func() bool {
		m := n.Metrics()
		return m.PrefillQueued == 0 && m.PrefillInFlight == 0
	})

	dest := kv.Tag{Incarnation: cfg.Incarnation, Index: 1, Generation: 1}
	frame := func(owner kv.Owner) kv.Frame {
		return kv.Frame{Owner: owner, Dest: dest, Tokens: 1, Payload: make([]byte, g.BytesPerToken())}
	}
	nobody := kv.Owner{Request: 1 << 40, Tenant: "acme"}
	if err := n.AcceptFrames(trust.Identity{}, []kv.Frame{frame(nobody)}); !errors.Is(err, kv.ErrRefused) {
		t.Fatalf("a frame for no request here: %v", err)
	}
	if err := n.AcceptFrames(trust.Identity{}, []kv.Frame{frame(nobody), frame(kv.Owner{Request: 2, Tenant: "acme"})}); !errors.Is(err, kv.ErrRefused) {
		t.Fatalf("frames of two requests in one batch: %v", err)
	}
	done := make(chan *messages.TransferDone, 1)
	decoder := n.Root().Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if m, ok := c.Message().(*messages.TransferDone); ok {
			done <- m
		}
	}))
	other := n.Model().Fingerprint()
	other[0] ^= 1
	n.Root().RequestWithCustomSender(n.dispatcher, &messages.TransferPlan{RequestID: 9, Tenant: "acme", TokenCount: 1,
		PromptTokens: []uint32{1}, PageTokens: uint32(cfg.PageTokens), DestTags: []kv.Tag{dest}, Model: other.String()}, decoder)
	if d := testwait.Recv(t, "the plan's TransferDone", time.Minute, done); d.Err == nil || d.Err.Code != messages.CodeModelMismatch {
		t.Fatalf("a plan of another model: %+v", d)
	}
	want := make([]uint64, integrityReasons)
	want[IntegrityStaleTag], want[IntegrityWrongOwner], want[IntegrityFingerprint] = 1, 1, 1
	if got := n.Metrics().Integrity; !slices.Equal(got, want) {
		t.Fatalf("integrity refusals %v, want %v (%v)", got, want, IntegrityReasonNames())
	}
}

func sum(v []uint64) uint64 {
	var s uint64
	for _, x := range v {
		s += x
	}
	return s
}
