package handoff

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/kv"
)

// decodeJob prefills prompt in p as owner and starts its decode job with
// spare pages for the tokens to come.
func decodeJob(t *testing.T, e engine.Engine, p PoolPages, owner kv.Owner, prompt []int, maxNew, spare int) *Sequence {
	t.Helper()
	g := p.Geometry()
	tags, err := p.Reserve(owner, 0, g.PagesFor(len(prompt)))
	if err != nil {
		t.Fatal(err)
	}
	pre, err := e.Prefill(p, owner, tags, prompt)
	if err != nil {
		t.Fatal(err)
	}
	job := StartDecode{Manifest: pre.Manifest, Next: pre.First, Last: prompt[len(prompt)-1], MaxNew: maxNew}
	if spare > 0 {
		if job.Spare, err = p.Reserve(owner, len(prompt), spare); err != nil {
			t.Fatal(err)
		}
	}
	s, err := Begin(e, p, job, engine.EOS)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

type outcome struct {
	tokens []int
	err    error
}

// TestStepBatchEqualsStep runs decode jobs together and, in a second set of
// the same jobs, each alone: every job streams the same tokens and ends the
// same way, the one whose spare pages run out failing alone.
func TestStepBatchEqualsStep(t *testing.T) {
	e, err := engine.NewReferenceEngine(tinyModel())
	if err != nil {
		t.Fatal(err)
	}
	pool, err := kv.NewPool(kv.DefaultConfig(e.Config().Geometry(4), 256, decodeInc))
	if err != nil {
		t.Fatal(err)
	}
	p := PoolPages{Pool: pool, Now: func() time.Time { return time.Unix(1_000_000, 0) }}
	jobs := []struct {
		prompt        string
		maxNew, spare int
	}{{"abc", 12, 3}, {"hello there", 9, 3}, {"no spare pages", 12, 1}, {"x", 1, 0}, {"a longer prompt, over pages", 16, 4}}
	run := func(batched bool, req uint64) []outcome {
		seqs := make([]*Sequence, len(jobs))
		out := make([]outcome, len(jobs))
		for i, j := range jobs {
			prompt := make([]int, len(j.prompt))
			for k, c := range []byte(j.prompt) {
				prompt[k] = int(c)
			}
			seqs[i] = decodeJob(t, e, p, kv.Owner{Request: req + uint64(i), Tenant: "batch"}, prompt, j.maxNew, j.spare)
			out[i].tokens = []int{seqs[i].job.Next}
		}
		live := slices.Clone(seqs)
		for len(live) > 0 {
			res := make([]Stepped, len(live))
			if batched {
				StepBatch(p, live, res)
			} else {
				for i, s := range live {
					res[i].Token, res[i].Done, res[i].Err = s.Step(p)
				}
			}
			var next []*Sequence
			for i, s := range live {
				k := slices.Index(seqs, s)
				if res[i].Err == nil {
					out[k].tokens = append(out[k].tokens, res[i].Token)
				}
				if !res[i].Done {
					next = append(next, s)
					continue
				}
				out[k].err = errors.Join(res[i].Err, s.Close(p))
			}
			live = next
		}
		return out
	}
	alone, together := run(false, 100), run(true, 200)
	for i := range jobs {
		if !slices.Equal(together[i].tokens, alone[i].tokens) || fmt.Sprint(together[i].err) != fmt.Sprint(alone[i].err) {
			t.Errorf("job %q: batched %v, %v; alone %v, %v", jobs[i].prompt,
				together[i].tokens, together[i].err, alone[i].tokens, alone[i].err)
		}
	}
	if alone[2].err == nil || alone[0].err != nil {
		t.Errorf("the job without enough spare pages ended with %v, a job with them with %v", alone[2].err, alone[0].err)
	}
}
