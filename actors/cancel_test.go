package actors

// The decode worker's own part in a cancellation: a sequence it drops is
// closed, so that its pages' leases come back at once. The request actor
// releases those pages anyway, and a leased page is reclaimed at
// ReclaimAfter, so an end-to-end test sees every page free either way; here
// the leases are read from the pages themselves, with no reclaim to hide a
// sequence dropped without being closed.

import (
	"errors"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/kv"
)

// heldEngine is an engine whose decode sequences block in their first step
// until release is called: a cancellation sent meanwhile waits in the
// worker's mailbox, and is handled while the sequence is still running.
type heldEngine struct {
	engine.Engine
	stepping chan struct{} // closed when the first step began
	gate     chan struct{}
	once     sync.Once
	first    sync.Once
}

func newHeldEngine(e engine.Engine) *heldEngine {
	return &heldEngine{Engine: e, stepping: make(chan struct{}), gate: make(chan struct{})}
}

func (h *heldEngine) release() { h.once.Do(func() { close(h.gate) }) }

func (h *heldEngine) Decode(pool engine.KV, m *kv.Manifest, next int) (engine.Sequence, error) {
	s, err := h.Engine.Decode(pool, m, next)
	if err != nil {
		return nil, err
	}
	return &heldSequence{Sequence: s, h: h}, nil
}

// heldSequence is a sequence of a heldEngine: not the reference engine's
// own type, so engine.StepBatch steps it by its Step.
type heldSequence struct {
	engine.Sequence
	h *heldEngine
}

func (s *heldSequence) Step(pool engine.KV) (int, error) {
	s.h.first.Do(func() {
		close(s.h.stepping)
		<-s.h.gate // released by the test, or by its cleanup
	})
	return s.Sequence.Step(pool)
}

// startHeldWorker starts a node of cfg and, beside its own, a decode
// worker named name over a pool of its own, whose engine is held.
func startHeldWorker(t *testing.T, cfg *Config, name string) (*Node, *Pool, *heldEngine, *actor.PID) {
	t.Helper()
	n := startNode(t, *cfg)
	pool := nodePool(t, n, name+"/pool", 16, cfg.CallTimeout)
	held := newHeldEngine(n.Model().Engine())
	t.Cleanup(held.release)
	w := newWorker("decode", n.Model(), pool, cfg, slog.New(slog.DiscardHandler), planPolicy{auth: n.Auth()})
	w.engine = held
	worker, err := n.Root().SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return w },
		actor.WithMailbox(n.Mailbox())), name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Root().StopFuture(worker).Wait() })
	return n, pool, held, worker
}

// TestCancelledSequenceIsClosed: a decode job cancelled while its
// sequence runs ends with DecodeDone "cancelled", and by then every page
// of its manifest has no reader left: the worker closed the sequence it
// dropped.
func TestCancelledSequenceIsClosed(t *testing.T) {
	cfg := testConfig()
	n, pool, held, worker := startHeldWorker(t, &cfg, "held-decode")

	// The prompt's KV, computed into the pool as its owner, and pages for
	// the tokens to come: what a request hands its decode worker.
	owner := kv.Owner{Request: 1, Tenant: "acme"}
	pages := newPageClient(pool, n.Root())
	prompt := []int{engine.BOS, 'h', 'e', 'l', 'd'}
	tags, err := pages.Reserve(owner, 0, cfg.Geometry().PagesFor(len(prompt)))
	if err != nil {
		t.Fatal(err)
	}
	pre, err := n.Model().Engine().Prefill(pages, owner, tags, prompt)
	if err != nil {
		t.Fatal(err)
	}
	spare, err := pages.Reserve(owner, len(prompt), 2)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan DecodeDone, 1)
	replyTo := n.Root().Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if m, ok := c.Message().(DecodeDone); ok {
			done <- m
		}
	}))
	n.Root().Send(worker, DecodeJob{StartDecode: handoff.StartDecode{Manifest: pre.Manifest, Next: pre.First,
		Last: prompt[len(prompt)-1], MaxNew: 16, Spare: spare}, ReplyTo: replyTo})
	testwait.Recv(t, "the sequence's first step", time.Minute, held.stepping)
	n.Root().Send(worker, CancelJob{Owner: owner}) // handled before the next step
	held.release()
	if m := testwait.Recv(t, "the cancelled job's DecodeDone", time.Minute, done); m.Owner != owner || !errors.Is(m.Err, ErrCancelled) {
		t.Fatalf("decode done %+v, want %s cancelled", m, owner)
	}
	for _, tag := range append(tags, spare...) {
		info, err := pool.Inspect(n.Root(), int(tag.Index))
		if err != nil {
			t.Fatal(err)
		}
		if info.Readers != 0 {
			t.Errorf("page %s of the cancelled sequence has %d readers (state %s)", tag, info.Readers, info.State)
		}
	}
	handoff.ExecRelease(pages, handoff.Release{Owner: owner, Tags: append(tags, spare...)}, func(tag kv.Tag, err error) {
		t.Errorf("release of %s: %v", tag, err)
	})
	if s, err := pool.Status(n.Root()); err != nil || s.Free != s.Capacity {
		t.Fatalf("pool after the release: %+v, %v; want every page free at once", s, err)
	}
}

// TestPausedJobHoldsStill: a decode job paused for a move answers with its
// pages and tail after the step in hand, each token of earlier steps sent
// before; it steps no more until resumed, and then goes on to the
// reference's answer. A paused job cancelled gives its leases back.
func TestPausedJobHoldsStill(t *testing.T) {
	cfg := testConfig()
	n, pool, held, worker := startHeldWorker(t, &cfg, "paused-decode")

	const maxNew = 12
	prompt := []int{engine.BOS, 'm', 'o', 'v', 'e'}
	want, err := n.Model().Engine().(*engine.ReferenceEngine).Reference(prompt, maxNew)
	if err != nil {
		t.Fatal(err)
	}
	for _, cancel := range []bool{false, true} {
		owner := kv.Owner{Request: 2, Tenant: "acme"}
		if cancel {
			owner.Request = 3
		}
		pages := newPageClient(pool, n.Root())
		tags, err := pages.Reserve(owner, 0, cfg.Geometry().PagesFor(len(prompt)))
		if err != nil {
			t.Fatal(err)
		}
		pre, err := n.Model().Engine().Prefill(pages, owner, tags, prompt)
		if err != nil {
			t.Fatal(err)
		}
		spare, err := pages.Reserve(owner, len(prompt), cfg.Geometry().PagesFor(maxNew-1))
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan any, 2*maxNew)
		replyTo := n.Root().Spawn(actor.PropsFromFunc(func(c actor.Context) {
			switch m := c.Message().(type) {
			case TokenOut, JobPaused, DecodeDone:
				got <- m
			}
		}))
		held.first = sync.Once{}
		held.stepping, held.gate, held.once = make(chan struct{}), make(chan struct{}), sync.Once{}
		n.Root().Send(worker, DecodeJob{StartDecode: handoff.StartDecode{Manifest: pre.Manifest, Next: pre.First,
			Last: prompt[len(prompt)-1], MaxNew: maxNew - 1, Spare: spare}, ReplyTo: replyTo})
		testwait.Recv(t, "the job's first step", time.Minute, held.stepping)
		n.Root().Send(worker, PauseJob{Owner: owner}) // handled after the step in hand
		held.release()
		var tokens []int
		var paused JobPaused
		for paused.Owner == (kv.Owner{}) {
			switch m := testwait.Recv(t, "the paused job's answer", time.Minute, got).(type) {
			case TokenOut:
				tokens = append(tokens, m.Token)
			case JobPaused:
				paused = m
			default:
				t.Fatalf("%+v before the pause's answer", m)
			}
		}
		positions := 0
		for _, p := range paused.Pages {
			positions += p.Tokens
		}
		if paused.Err != nil || len(tokens) != 2 || positions != len(prompt)+len(tokens)-1 {
			t.Fatalf("paused after %v: %+v (%d positions)", tokens, paused, positions)
		}
		if cancel {
			n.Root().Send(worker, CancelJob{Owner: owner})
			if m := testwait.Recv(t, "the cancelled job's end", time.Minute, got); !errors.Is(m.(DecodeDone).Err, ErrCancelled) {
				t.Fatalf("a paused job cancelled: %+v", m)
			}
		} else {
			n.Root().Send(worker, ResumeJob{Owner: owner})
			for done := false; !done; {
				switch m := testwait.Recv(t, "the resumed job's tokens", time.Minute, got).(type) {
				case TokenOut:
					tokens = append(tokens, m.Token)
				case DecodeDone:
					done = m.Err == nil || t.Failed()
					if m.Err != nil {
						t.Fatalf("the resumed job ended with %v", m.Err)
					}
				default:
					t.Fatalf("%+v while resumed", m)
				}
			}
			if !slices.Equal(tokens, want) {
				t.Fatalf("paused and resumed: %v, want %v", tokens, want)
			}
		}
		for _, tag := range append(tags, spare...) {
			if info, err := pool.Inspect(n.Root(), int(tag.Index)); err != nil || info.Readers != 0 {
				t.Errorf("page %s: %+v, %v; want no reader", tag, info, err)
			}
		}
		handoff.ExecRelease(pages, handoff.Release{Owner: owner, Tags: append(tags, spare...)}, nil)
	}
}
