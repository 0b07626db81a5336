package sim

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
)

// The oracle must be able to fail: each test here breaks one invariant by
// hand, in a world built and not run, and wants that invariant named.

func quietWorld(t *testing.T) *world {
	t.Helper()
	opt := DefaultOptions()
	opt.Faults = Faults{}
	w := newWorld(1, opt)
	if w.violation != nil {
		t.Fatal(w.violation)
	}
	return w
}

func wantViolation(t *testing.T, w *world, invariant, contains string) {
	t.Helper()
	switch v := w.violation; {
	case v == nil:
		t.Fatalf("no violation, want %q", invariant)
	case v.Invariant != invariant || !strings.Contains(v.Message, contains):
		t.Fatalf("violation %q: %s\nwant %q containing %q", v.Invariant, v.Message, invariant, contains)
	}
}

var alice = kv.Owner{Request: 1, Tenant: "tenant-a"}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// sealedPage reserves, fills and seals one page of n's pool through the
// oracle, as owner.
func sealedPage(t *testing.T, n *node, owner kv.Owner) kv.Tag {
	t.Helper()
	tags, err := n.pages.Reserve(owner, 0, 1)
	must(t, err)
	row := make([]byte, n.pages.pool.Geometry().BytesPerToken())
	must(t, n.pages.Write(tags[0], owner, 0, row))
	_, err = n.pages.Seal(tags[0], owner)
	must(t, err)
	return tags[0]
}

func TestOracleCatchesAWrongAnswer(t *testing.T) {
	w := quietWorld(t)
	c := w.clients[0]
	c.want = []int{1, 2, 3}
	c.chunk("", &messages.TokenChunk{RequestID: c.id, Seq: 1, Tokens: []uint32{1}})
	if w.violation != nil {
		t.Fatalf("a right token: %v", w.violation)
	}
	c.chunk("", &messages.TokenChunk{RequestID: c.id, Seq: 2, Tokens: []uint32{7}})
	wantViolation(t, w, "answers", "streamed token 7 at position 1")

	w = quietWorld(t)
	c = w.clients[0]
	c.want, c.emitted = []int{1, 2}, []int{1, 2}
	c.finish("", handoff.Finish{Tokens: []int{1, 3}, Result: &messages.GenerateResult{RequestID: c.id, Tokens: []uint32{1, 3},
		FinishReason: messages.FinishLength}})
	wantViolation(t, w, "answers", "got the answer [1 3]")
}

func TestOracleCatchesAnAnswerAfterAnError(t *testing.T) {
	w := quietWorld(t)
	c := w.clients[0]
	c.nodeLost("gone")
	c.chunk("", &messages.TokenChunk{RequestID: c.id, Seq: 1, Tokens: []uint32{uint32(c.want[0])}})
	wantViolation(t, w, "answers", "after its request ended (node_lost)")
}

func TestOracleCatchesAnUntypedError(t *testing.T) {
	w := quietWorld(t)
	w.clients[0].refused(&messages.WireError{Code: 99, Message: "who knows"})
	wantViolation(t, w, "typed errors", "without a stable error code")
}

func TestOracleCatchesAnErrorNoFaultExplains(t *testing.T) {
	w := quietWorld(t)
	w.clients[0].refused(&messages.WireError{Code: messages.CodeInternal, Message: "a bug"})
	wantViolation(t, w, "typed errors", "failed with internal, which no fault explains")
}

func TestOracleCatchesAdmissionPastTheSmallestPool(t *testing.T) {
	w := quietWorld(t)
	c := w.clients[0]
	c.prompt, c.maxNew = make([]int, 40), 1
	w.prefill[0].pagesN = 9 // 36 tokens
	w.checkPath(c, w.prefill[0], w.decode[0], nil)
	wantViolation(t, w, "admission", "cannot hold it")

	w = quietWorld(t)
	c = w.clients[0]
	c.prompt, c.maxNew = make([]int, 4), 1
	w.checkPath(c, w.prefill[0], w.decode[0], &handoff.BusyError{Where: "x"})
	wantViolation(t, w, "admission", "refused on a path that holds it")
}

func TestOracleCatchesAPageOwnedWithoutAReservation(t *testing.T) {
	w := quietWorld(t)
	n := w.decode[0]
	if _, err := n.pages.pool.Reserve(alice, 0, 1, w.now); err != nil { // behind the oracle's back
		t.Fatal(err)
	}
	w.checkStep()
	wantViolation(t, w, "one owner", "no reservation handed it out")
}

func TestOracleCatchesAnAccessByAnotherOwner(t *testing.T) {
	w := quietWorld(t)
	n := w.decode[0]
	tag := sealedPage(t, n, alice)
	n.pages.held[tag.Index].owner.Request = 2 // as if the pool had let request 1 into request 2's page
	_, err := n.pages.Lease(tag, alice)
	must(t, err)
	wantViolation(t, w, "one owner", "let request 1 of tenant \"tenant-a\" lease page")
}

func TestOracleCatchesAGenerationThatDidNotGrow(t *testing.T) {
	w := quietWorld(t)
	n := w.decode[0]
	n.pages.gen[0] = 5 // a page that had a tenancy at generation 5, now handed out at 1
	_, err := n.pages.Reserve(alice, 0, 1)
	must(t, err)
	wantViolation(t, w, "generations grow", "at generation 1; its previous tenancy")
}

func TestOracleCatchesARowOfAnotherTenant(t *testing.T) {
	w := quietWorld(t)
	n := w.decode[0]
	tag := sealedPage(t, n, alice)
	n.pages.rows[int(tag.Index)*n.pages.pt] = label{inc: n.inc, owner: kv.Owner{Request: 9, Tenant: "tenant-b"}}
	l, err := n.pages.Lease(tag, alice)
	must(t, err)
	_, _, err = n.pages.Read(l)
	must(t, err)
	wantViolation(t, w, "provenance", "another tenant's bytes")
}

func TestOracleCatchesASourcePageFreedBeforeItsAck(t *testing.T) {
	w := quietWorld(t)
	n := w.prefill[0]
	tag := sealedPage(t, n, alice)
	must(t, n.pages.AwaitAck(tag, alice))
	must(t, n.pages.pool.Ack(tag, alice)) // behind the oracle's back
	must(t, n.pages.Release(tag, alice))
	w.checkStep()
	wantViolation(t, w, "release after ack", "freed while it awaited decode's acknowledgement")
}

func TestOracleCatchesAPageLeftOwned(t *testing.T) {
	w := quietWorld(t)
	for _, c := range w.clients {
		c.end("answered")
	}
	sealedPage(t, w.decode[1], alice)
	w.q = nil // nothing else happens
	w.run()
	wantViolation(t, w, "pages released", "1 pages owned after every request ended")
}

func TestOracleCatchesAPageNotFreedAtItsDeadline(t *testing.T) {
	w := quietWorld(t)
	for _, c := range w.clients {
		c.end("answered")
	}
	n := w.prefill[0]
	tag := sealedPage(t, n, alice)
	must(t, n.pages.AwaitAck(tag, alice))
	must(t, n.pages.Release(tag, alice))                               // released, its ack never to come
	w.opt.Timing.ReclaimAfter, w.opt.Timing.Tick = 0, time.Millisecond // the end looks before the pool's deadline
	w.q = nil
	w.run()
	wantViolation(t, w, "pages freed", "1 pages neither free nor cached")
}

func TestOracleCatchesARequestThatNeverEnded(t *testing.T) {
	w := quietWorld(t)
	w.q = nil
	w.run()
	wantViolation(t, w, "liveness", "never got an answer or an error")

	w = quietWorld(t)
	w.opt.StepsMax = 3
	w.run()
	wantViolation(t, w, "liveness", "has not quiesced after 3 steps")
}

func TestOracleCatchesCorruptionThatPassedTheDecoder(t *testing.T) {
	w := quietWorld(t)
	g := w.limits.Geometry
	frame := func(b byte) []byte {
		f := kv.Frame{Owner: alice, Source: kv.Tag{Incarnation: 1, Generation: 1}, Dest: kv.Tag{Incarnation: 2, Generation: 1},
			Tokens: 1, Payload: bytes.Repeat([]byte{b}, g.BytesPerToken())}
		body, err := kv.AppendBatch(nil, []kv.Frame{f}, w.batch)
		if err != nil {
			t.Fatal(err)
		}
		return body
	}
	// Bytes that differ from those sent yet decode: what a checksum that
	// misses a change lets through.
	if _, err := w.decodeBatch(&batch{body: frame(1), sent: frame(2)}); err != nil {
		t.Fatal(err)
	}
	wantViolation(t, w, "corruption refused", "passed the decoder")

	w = quietWorld(t)
	garbage := []byte("KVB1 not a batch")
	if _, err := w.decodeBatch(&batch{body: garbage, sent: garbage}); err == nil {
		t.Fatal("garbage decoded")
	}
	wantViolation(t, w, "corruption refused", "an intact batch was refused")
}

// chatty answers every event with an effect.
type chatty struct{}

func (chatty) Step(handoff.Event, time.Time) []handoff.Effect {
	return []handoff.Effect{handoff.Emit{Chunk: &messages.TokenChunk{RequestID: 1, Seq: 1, Tokens: []uint32{1}}}}
}

func TestOracleCatchesALateMessageThatChangedSomething(t *testing.T) {
	w := quietWorld(t)
	dr := &dreq{n: w.decode[0], c: w.clients[0], name: "1"}
	q := &quiet{Machine: chatty{}, dr: dr, what: "a late TransferDone"}
	dr.r = handoff.NewRequest(w.decode[0].cfg, alice, 1, []int{engine.BOS}, 1, w.prefill[0].peer())
	q.Step(handoff.Start{}, w.now)
	wantViolation(t, w, "late messages ignored", "took a late TransferDone")
}

func TestOracleTurnsAPanicIntoAViolation(t *testing.T) {
	w := quietWorld(t)
	w.guard(func() { panic("kv: two owners") })
	wantViolation(t, w, "panic", "kv: two owners")
}

func TestUnreachedNamesEachRequiredCounter(t *testing.T) {
	var c Counters
	f := Faults{Corrupt: 0.1}
	if got, want := c.Unreached(f), []string{"Corrupt: frame batch corrupted", "Corrupt: corrupt batch refused by checksum"}; !slices.Equal(got, want) {
		t.Fatalf("unreached %q, want %q", got, want)
	}
	c[BatchCorrupted], c[BatchRefusedChecksum] = 1, 1
	if got := c.Unreached(f); len(got) != 0 {
		t.Fatalf("unreached %q with both counted", got)
	}
}

func TestSimIsDeterministic(t *testing.T) {
	opt := DefaultOptions()
	var trace bytes.Buffer
	traced := opt
	traced.Trace = &trace
	hashes := map[uint64]uint64{}
	for seed := uint64(1); seed <= 20; seed++ {
		a, b := Run(seed, opt), Run(seed, traced)
		if a.TraceHash != b.TraceHash || a.Steps != b.Steps || a.Counters != b.Counters {
			t.Fatalf("seed %d ran twice: hash %x and %x, %d and %d steps", seed, a.TraceHash, b.TraceHash, a.Steps, b.Steps)
		}
		if other, dup := hashes[a.TraceHash]; dup {
			t.Fatalf("seeds %d and %d have the same trace hash %x", other, seed, a.TraceHash)
		}
		hashes[a.TraceHash] = seed
	}
	if !strings.Contains(trace.String(), "step 1 ") {
		t.Fatalf("the trace has no steps: %.200q", trace.String())
	}
}

func TestInvalidOptionsAreAViolation(t *testing.T) {
	opt := DefaultOptions()
	opt.Timing.OwnedTimeout = opt.Timing.RequestTimeout
	r := Run(1, opt)
	if r.Violation == nil || r.Violation.Invariant != "options" || !strings.Contains(r.Violation.Message, "OwnedTimeout") {
		t.Fatalf("violation %v, want options naming OwnedTimeout", r.Violation)
	}
}

func TestOracleCatchesASourceAckBeforeDecodes(t *testing.T) {
	w := quietWorld(t)
	n := w.prefill[0]
	tag := sealedPage(t, n, alice)
	n.jobs[alice.Request] = &job{local: alice.Request} // planned, and neither acknowledged, aborted nor failed
	n.doSource(handoff.Ack{Owner: alice, Tags: []kv.Tag{tag}}, nil, 0)
	wantViolation(t, w, "release after ack", "without decode's ack, an abort or a failed transfer")
}

// cachedPage has a source page of owner's, full, sealed and awaiting its
// ack, acknowledged into n's pool as a cached page of scope, through the
// oracle, as a prefill's would be once decode has it; the job of owner
// has the oracle's scope name.
func cachedPage(t *testing.T, n *node, owner kv.Owner, name string, scope kv.Scope) kv.CachedPage {
	t.Helper()
	n.jobs[owner.Request] = &job{local: owner.Request, scope: name, read: map[kv.Tag]bool{}, prompt: make([]int, 2*n.w.opt.PageTokens)}
	tags, err := n.pages.Reserve(owner, 0, 1)
	must(t, err)
	row := make([]byte, n.pages.pool.Geometry().BytesPerToken())
	for r := range n.w.opt.PageTokens {
		must(t, n.pages.Write(tags[0], owner, r, row))
	}
	_, err = n.pages.Seal(tags[0], owner)
	must(t, err)
	must(t, n.pages.AwaitAck(tags[0], owner))
	must(t, n.pages.Release(tags[0], owner))
	c, err := n.pages.AckPublish(tags[0], owner, scope)
	must(t, err)
	if c.Tag == (kv.Tag{}) {
		t.Fatal("the page was acknowledged, not published")
	}
	return c
}

func TestOracleCatchesASharedReadOfAnotherScope(t *testing.T) {
	w := quietWorld(t)
	n := w.prefill[0]
	scope := kv.SharedScope("shared")
	c := cachedPage(t, n, alice, "group shared", scope)
	bob := kv.Owner{Request: 2, Tenant: "tenant-b"}
	n.jobs[bob.Request] = &job{local: bob.Request, scope: "tenant tenant-b", read: map[kv.Tag]bool{}}
	l, err := n.pages.LeaseShared(c, bob, scope) // the pool's scope agrees: the policy gave both the same
	must(t, err)
	if w.violation != nil {
		t.Fatalf("a shared lease: %v", w.violation)
	}
	_, _, err = n.pages.Read(l)
	must(t, err)
	wantViolation(t, w, "provenance", "of tenant tenant-b, read row 0 of cached page")
}

func TestOracleAcceptsASharedReadOfItsScope(t *testing.T) {
	w := quietWorld(t)
	n := w.prefill[0]
	scope := kv.SharedScope("shared")
	c := cachedPage(t, n, alice, "group shared", scope)
	bob := kv.Owner{Request: 2, Tenant: "tenant-b"}
	n.jobs[bob.Request] = &job{local: bob.Request, scope: "group shared", read: map[kv.Tag]bool{}}
	l, err := n.pages.LeaseShared(c, bob, scope)
	must(t, err)
	_, _, err = n.pages.Read(l)
	must(t, err)
	must(t, n.pages.Unlease(l))
	if w.violation != nil || !n.jobs[bob.Request].read[c.Tag] {
		t.Fatalf("a read of the reader's own scope: %v; read recorded %t", w.violation, n.jobs[bob.Request].read[c.Tag])
	}
}

func TestOracleCatchesALookupOfAnotherScope(t *testing.T) {
	w := quietWorld(t)
	n := w.prefill[0]
	c := cachedPage(t, n, alice, "tenant tenant-a", kv.TenantScope("tenant-a"))
	_, err := n.pages.LeaseShared(c, kv.Owner{Request: 2, Tenant: "tenant-b"}, kv.TenantScope("tenant-b"))
	if err == nil {
		t.Fatal("the pool leased tenant-a's page under tenant-b's scope")
	}
	wantViolation(t, w, "cache scope", "another scope published it")
}

func TestOracleCatchesALeaseCountThatDisagrees(t *testing.T) {
	w := quietWorld(t)
	n := w.prefill[0]
	scope := kv.TenantScope("tenant-a")
	c := cachedPage(t, n, alice, "tenant tenant-a", scope)
	l, err := n.pages.LeaseShared(c, alice, scope)
	must(t, err)
	must(t, n.pages.pool.Unlease(l)) // behind the oracle's back: the pool counts no reader now
	must(t, n.pages.Evict(c))
	wantViolation(t, w, "lease count", "freed with 1 shared leases on it held")
}

func TestOracleCatchesACachedPageTheIndexLost(t *testing.T) {
	w := quietWorld(t)
	n := w.prefill[0]
	cachedPage(t, n, alice, "tenant tenant-a", kv.TenantScope("tenant-a")) // published, never added to n's index
	w.checkStep()
	wantViolation(t, w, "cache index", "the prefix index holds 0 pages and the pool 1 cached pages")
}

func TestOracleCatchesCachedTokensNotRead(t *testing.T) {
	w := quietWorld(t)
	c := w.clients[0]
	n := w.decode[0]
	c.origin = &dreq{n: n, c: c, r: handoff.NewRequest(n.cfg, alice, c.id, c.prompt, c.maxNew, w.prefill[0].peer())}
	c.originInc = n.inc
	w.cachedRead[handoff.JobKey{Sender: senderKey(n.addr, n.inc), ID: alice.Request}] = 4
	c.checkCached(4)
	if w.violation != nil {
		t.Fatalf("the tokens read: %v", w.violation)
	}
	c.checkCached(8)
	wantViolation(t, w, "cached tokens", "was told 8 prompt tokens came from the cache; the prefill of its attempt 1 read 4")
}

// heldCopy has a page of writer's, on decode node n, published as a
// cached page of scope, leased by reader, copied into a page of reader's
// and the lease given back, all through the oracle, as a reservation
// through a decode cache would; each is the attempt of a client with the
// tenant the owner names and no salt. It returns the copy, not sealed.
func heldCopy(t *testing.T, n *node, writer, reader kv.Owner, scope kv.Scope) (kv.Tag, kv.CachedPage) {
	t.Helper()
	w := n.w
	for i, o := range []kv.Owner{writer, reader} {
		c := w.clients[i]
		c.tenant, c.salt = o.Tenant, ""
		w.byAttempt[handoff.JobKey{Sender: senderKey(n.addr, n.inc), ID: o.Request}] = c
	}
	tags, err := n.pages.Reserve(writer, 0, 1)
	must(t, err)
	row := make([]byte, n.pages.pool.Geometry().BytesPerToken())
	for r := range w.opt.PageTokens {
		must(t, n.pages.Write(tags[0], writer, r, row))
	}
	_, err = n.pages.Seal(tags[0], writer)
	must(t, err)
	c, err := n.pages.Publish(tags[0], writer, scope)
	must(t, err)
	l, err := n.pages.LeaseShared(c, reader, scope)
	must(t, err)
	b, _, err := n.pages.Read(l)
	must(t, err)
	dest, err := n.pages.Reserve(reader, 0, 1)
	must(t, err)
	must(t, n.pages.Write(dest[0], reader, 0, b))
	must(t, n.pages.Unlease(l))
	return dest[0], c
}

func TestOracleFollowsAHeldCopyOfItsScope(t *testing.T) {
	w := quietWorld(t)
	n := w.decode[0]
	w.groups = map[string]string{"tenant-a": cacheGroup, "tenant-b": cacheGroup}
	bob := kv.Owner{Request: 2, Tenant: "tenant-b"}
	dest, c := heldCopy(t, n, alice, bob, kv.SharedScope(cacheGroup))
	if got, want := n.pages.rows[int(dest.Index)*n.pages.pt], (label{inc: n.inc, owner: alice}); got != want {
		t.Fatalf("the copy's first row is labelled %s, want the cached row's %s", got, want)
	}
	_, err := n.pages.SealFrom(dest, bob, c.Origin())
	must(t, err)
	l, err := n.pages.Lease(dest, bob)
	must(t, err)
	_, _, err = n.pages.Read(l)
	must(t, err)
	if w.violation != nil || n.pages.copies[bob.Request] != 1 {
		t.Fatalf("a held copy of the reader's scope: %v; copies counted %d", w.violation, n.pages.copies[bob.Request])
	}
}

func TestOracleCatchesAHeldCopySealedWithARowOfAnotherScope(t *testing.T) {
	for _, tc := range []struct {
		name string
		row  func(n *node) label
		want string
	}{
		{"flipped", func(*node) label { return flipped }, "corrupted bytes"},
		{"another scope", func(n *node) label { return label{inc: n.inc, owner: kv.Owner{Request: 3, Tenant: "tenant-c"}} }, "another tenant's bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := quietWorld(t)
			n := w.decode[0]
			w.groups = map[string]string{"tenant-a": cacheGroup, "tenant-b": cacheGroup}
			bob := kv.Owner{Request: 2, Tenant: "tenant-b"}
			carol := w.clients[2]
			carol.tenant, carol.salt = "tenant-c", ""
			w.byAttempt[handoff.JobKey{Sender: senderKey(n.addr, n.inc), ID: 3}] = carol
			dest, _ := heldCopy(t, n, alice, bob, kv.SharedScope(cacheGroup))
			n.pages.rows[int(dest.Index)*n.pages.pt+1] = tc.row(n) // what a copy not checked against its source would hold
			_, err := n.pages.Seal(dest, bob)
			must(t, err)
			l, err := n.pages.Lease(dest, bob)
			must(t, err)
			_, _, err = n.pages.Read(l)
			must(t, err)
			wantViolation(t, w, "provenance", "read row 1 of page "+dest.String()+" through its lease and got "+tc.want)
		})
	}
}

func TestOracleCatchesHeldPagesNotCopied(t *testing.T) {
	w := quietWorld(t)
	n := w.decode[0]
	bob := kv.Owner{Request: 2, Tenant: "tenant-b"}
	dest, _ := heldCopy(t, n, kv.Owner{Request: 1, Tenant: "tenant-b"}, bob, kv.TenantScope("tenant-b"))
	dr := &dreq{n: n, c: w.clients[1], name: "2"}
	more, err := n.pages.Reserve(bob, 4, 1)
	must(t, err)
	dr.checkHeld(&messages.TransferPlan{RequestID: bob.Request, HeldPages: 1, DestTags: []kv.Tag{dest, more[0]}})
	if w.violation != nil {
		t.Fatalf("the page copied, named held: %v", w.violation)
	}
	dr.checkHeld(&messages.TransferPlan{RequestID: bob.Request, HeldPages: 2, DestTags: []kv.Tag{dest, more[0]}})
	wantViolation(t, w, "held pages", "names 2 held pages")
}

// effects is a machine that answers every event with the same effects.
type effects []handoff.Effect

func (e effects) Step(handoff.Event, time.Time) []handoff.Effect { return e }

func TestOracleCatchesAReleaseMidMove(t *testing.T) {
	w := quietWorld(t)
	dr := &dreq{n: w.decode[0], name: "1", mv: &moving{id: 9}}
	release := handoff.Release{Owner: alice, Tags: []kv.Tag{{Incarnation: w.decode[0].inc, Index: 1, Generation: 1}}}
	moveChecked{Machine: effects{release, handoff.SendMoveDone{}}, dr: dr}.Step(handoff.MoveSent{MoveID: 9}, w.now)
	wantViolation(t, w, "release after ack", "gave pages back during move 9")

	w = quietWorld(t)
	dr = &dreq{n: w.decode[0], name: "1", mv: &moving{id: 9}}
	moved := handoff.Finish{Result: &messages.GenerateResult{RequestID: 1}, Silent: true, Moved: true}
	moveChecked{Machine: effects{release, moved}, dr: dr}.Step(handoff.MoveDeadline{MoveID: 9}, w.now)
	wantViolation(t, w, "release after ack", "ended moved at handoff.MoveDeadline")

	// On the target's ack, and as the request ends otherwise, the pages go.
	w = quietWorld(t)
	dr = &dreq{n: w.decode[0], name: "1", mv: &moving{id: 9, acking: true}}
	moveChecked{Machine: effects{release, moved}, dr: dr}.Step(handoff.MoveAckIn{FromTarget: true}, w.now)
	dr.mv = &moving{id: 9}
	moveChecked{Machine: effects{release, handoff.Finish{Result: &messages.GenerateResult{RequestID: 1}}}, dr: dr}.Step(handoff.Cancel{}, w.now)
	if w.violation != nil {
		t.Fatal(w.violation)
	}
}

// TestRelayRefusesAnotherNodesChunk: the relay passes a chunk of the node
// its stream is on and refuses, counting it, one of another node with the
// same id and the next number; after a hand-over it hears only the node
// the stream moved to.
func TestRelayRefusesAnotherNodesChunk(t *testing.T) {
	w := quietWorld(t)
	c := w.clients[0]
	c.stream = handoff.NewStream(c.id, "decode-0:7000")
	c.chunk("decode-1:7000", &messages.TokenChunk{RequestID: c.id, Seq: 1, Tokens: []uint32{uint32(c.want[0]) + 1}})
	if w.violation != nil || w.count[RelayRefused] != 1 || len(c.emitted) != 0 {
		t.Fatalf("a chunk of another node: violation %v, %d refused, %v passed", w.violation, w.count[RelayRefused], c.emitted)
	}
	c.chunk("decode-0:7000", &messages.TokenChunk{RequestID: c.id, Seq: 1, Tokens: []uint32{uint32(c.want[0])}})
	if w.violation != nil || len(c.emitted) != 1 {
		t.Fatalf("the stream's node's chunk: violation %v, %v passed", w.violation, c.emitted)
	}
	if why := c.stream.Moved(&messages.StreamMoved{RequestID: c.id, Seq: 1, To: "decode-1:7000"}); why != "" || c.stream.HandOver() == nil {
		t.Fatalf("hand-over refused: %s", why)
	}
	c.chunk("decode-0:7000", &messages.TokenChunk{RequestID: c.id, Seq: 2, Tokens: []uint32{uint32(c.want[1])}})
	if w.violation != nil || len(c.emitted) != 1 || w.count[RelayRefused] != 1 {
		t.Fatalf("a chunk of the node left: violation %v, %v passed, %d refused", w.violation, c.emitted, w.count[RelayRefused])
	}
}
