package handoff

// The decode side's own checks: Begin's recomputation of prefill's first
// token (and what it leaves behind when it refuses), a sequence's token
// budget and end, and a Request that hears its decode job end before its
// tokens did. End-to-end tests see a wrong answer refused or a page
// reclaimed later; these see the check itself.

import (
	"errors"
	"slices"
	"testing"

	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
)

// prefilledJob computes prompt's KV into p's decode pool as owner and is
// the decode job a verified transfer would start, spare pages included.
func prefilledJob(t *testing.T, p *pair, owner kv.Owner, prompt []int, maxNew int) StartDecode {
	t.Helper()
	g := p.decode.Geometry()
	tags, err := p.decode.Reserve(owner, 0, g.PagesFor(len(prompt)))
	if err != nil {
		t.Fatal(err)
	}
	pre, err := p.engine.Prefill(p.decode, owner, tags, prompt)
	if err != nil {
		t.Fatal(err)
	}
	spare, err := p.decode.Reserve(owner, len(prompt), g.PagesFor(maxNew))
	if err != nil {
		t.Fatal(err)
	}
	return StartDecode{Manifest: pre.Manifest, Next: pre.First, Last: prompt[len(prompt)-1], MaxNew: maxNew - 1, Spare: spare}
}

// readers is the leases outstanding on the pages of m.
func readers(p *pair, m *kv.Manifest) int {
	n := 0
	for _, mp := range m.Pages {
		n += p.decode.Inspect(mp.Tag.Index).Readers
	}
	return n
}

// TestBeginRefusesAFirstTokenTheKVDoesNotGive: a first token other than
// the one the KV received gives is refused with both tokens, and the
// refusal leaves no lease on the pages; the right one starts the job.
func TestBeginRefusesAFirstTokenTheKVDoesNotGive(t *testing.T) {
	p := newPair(t, 16, 16)
	owner := kv.Owner{Request: 1, Tenant: "acme"}
	job := prefilledJob(t, p, owner, []int{engine.BOS, 'h', 'e', 'l', 'l', 'o'}, 4)
	right := job.Next
	job.Next = (right + 1) % tinyModel().Vocab
	s, err := Begin(p.engine, p.decode, job, engine.EOS)
	var ft *FirstTokenError
	if s != nil || !errors.As(err, &ft) || ft.Prefill != job.Next || ft.Decode != right {
		t.Fatalf("first token %d where the KV gives %d: %v, %v", job.Next, right, s, err)
	}
	if w := Wire(err); w.Code != messages.CodeIntegrity {
		t.Fatalf("told as %+v, want an integrity failure", w)
	}
	if n := readers(p, job.Manifest); n != 0 {
		t.Fatalf("%d leases left on the pages of a refused job", n)
	}
	job.Next = right
	if s, err = Begin(p.engine, p.decode, job, engine.EOS); err != nil {
		t.Fatalf("the right first token: %v", err)
	}
	if n := readers(p, job.Manifest); n != len(job.Manifest.Pages) {
		t.Fatalf("%d leases on the %d pages of a running job", n, len(job.Manifest.Pages))
	}
	if err := s.Close(p.decode); err != nil || readers(p, job.Manifest) != 0 {
		t.Fatalf("close: %v, %d leases left", err, readers(p, job.Manifest))
	}
}

// TestSequenceStopsAtItsBudget: a sequence steps exactly MaxNew tokens
// after its first, each the reference's, done at the last and not before;
// a first token that is EOS, or a budget of none, ends the job at once.
func TestSequenceStopsAtItsBudget(t *testing.T) {
	p := newPair(t, 16, 16)
	prompt := []int{engine.BOS, 'a', 'b', 'c', 'd', 'e'}
	want, err := p.engine.Reference(prompt, 6)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(want, engine.EOS) {
		t.Fatalf("the reference %v meets EOS: the test needs a prompt that does not", want)
	}
	job := prefilledJob(t, p, kv.Owner{Request: 1, Tenant: "acme"}, prompt, 6)
	s, err := Begin(p.engine, p.decode, job, engine.EOS)
	if err != nil {
		t.Fatal(err)
	}
	if s.Ended() {
		t.Fatal("a job of 5 more tokens ended at its first")
	}
	got := []int{job.Next}
	for done := false; !done; {
		var tok int
		if tok, done, err = s.Step(p.decode); err != nil {
			t.Fatal(err)
		}
		got = append(got, tok)
		if len(got) > len(want) {
			t.Fatalf("stepped past its budget: %v", got)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("tokens %v, the reference %v", got, want)
	}
	if err := s.Close(p.decode); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		next, maxNew int
		ended        bool
	}{{engine.EOS, 5, true}, {'x', 0, true}, {'x', 1, false}} {
		s := &Sequence{job: StartDecode{Next: tc.next, MaxNew: tc.maxNew}, eos: engine.EOS}
		if s.Ended() != tc.ended {
			t.Errorf("first token %d, %d more: ended %t, want %t", tc.next, tc.maxNew, s.Ended(), tc.ended)
		}
	}
}

// TestDecodeEndingEarlyIsAFailure: a decode job that ends (without an
// error) before the request's tokens are all out and without EOS answers
// the client with an error, never as complete; one that met EOS or its
// budget completes.
func TestDecodeEndingEarlyIsAFailure(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tokens []int
		finish messages.FinishReason
	}{
		{"no token", nil, messages.FinishError},
		{"two of four", []int{'a', 'b'}, messages.FinishError},
		{"EOS after two", []int{'a', engine.EOS}, messages.FinishStop},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLone(t, 10, 4)
			l.r.cfg.EOS = engine.EOS
			frames := []kv.Frame{l.frame(0, 4), l.frame(1, 4), l.frame(2, 2)}
			if _, ok := only[SealVerify](l.transfer(frames, l.done(3, 3))); !ok {
				t.Fatal("the transfer was not sealed")
			}
			if _, ok := find[StartDecode](l.step(Verified{})); !ok {
				t.Fatal("the verified transfer did not start decoding")
			}
			var fin Finish
			for _, tok := range tc.tokens {
				for _, e := range l.step(TokenIn{Token: tok}) {
					if f, ok := e.(Finish); ok {
						fin = f
					}
				}
			}
			if fin.Result == nil {
				f, ok := find[Finish](l.step(DecodeEnded{}))
				if !ok {
					t.Fatal("the decode job's end did not end the request")
				}
				fin = f
			}
			if fin.Result.FinishReason != tc.finish || (tc.finish == messages.FinishError) != (fin.Cause != nil) {
				t.Fatalf("after %v and the decode job's end: %+v, cause %v; want %s", tc.tokens, fin.Result, fin.Cause, tc.finish)
			}
		})
	}
}
