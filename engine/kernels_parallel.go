package engine

import (
	"runtime"
	"sync"
)

// A step with enough work splits it between goroutines: the output rows of
// a large matrix product, or the rows (or KV heads) of attention. Every
// output element is computed by one kernel call whose bits do not depend on
// which other elements it is computed with, so a split changes the speed
// only. Small work runs on the caller alone: waking a helper goroutine
// takes tens of microseconds on a virtual machine, which a small model's
// step would feel, so a split must give each part more work than that.

// partsMax bounds the goroutines one piece of work is split across.
const partsMax = 8

// Work below these sizes runs on the caller's goroutine alone. They are
// variables so that a test can split everything, or nothing.
var (
	// matmulSplitMin is multiply-adds of one matrix product.
	matmulSplitMin = 1 << 21
	// attendSplitMin is multiply-adds of one layer's attention: scores and
	// weighted sums over every position of every row.
	attendSplitMin = 1 << 21
)

// job is work in parts that may run at once: run(p, parts) does part p.
type job interface {
	run(part, parts int)
}

type helperCall struct {
	j           job
	part, parts int
	wg          *sync.WaitGroup
}

// helpers are goroutines that run parts of jobs; there is one fewer than
// the processors Go runs on, since the caller runs a part too.
var helpers struct {
	once  sync.Once
	n     int
	calls chan helperCall
}

func startHelpers() {
	helpers.n = min(runtime.GOMAXPROCS(0), partsMax) - 1
	helpers.calls = make(chan helperCall)
	for range helpers.n {
		go func() {
			for c := range helpers.calls {
				c.j.run(c.part, c.parts)
				c.wg.Done()
			}
		}()
	}
}

// splitParts is how many parts work of size work splits into, given the
// size least below which splitting does not pay.
func splitParts(work, least int) int {
	if work < least {
		return 1
	}
	helpers.once.Do(startHelpers)
	return helpers.n + 1
}

// split runs the parts of j and returns when all have run. A part no
// helper is free for (another engine's step holds them) runs on the
// caller; wg is the caller's, so that waiting allocates nothing.
func split(j job, parts int, wg *sync.WaitGroup) {
	for p := 1; p < parts; p++ {
		wg.Add(1)
		select {
		case helpers.calls <- helperCall{j: j, part: p, parts: parts, wg: wg}:
		default:
			j.run(p, parts)
			wg.Done()
		}
	}
	j.run(0, parts)
	wg.Wait()
}

// partRange is part p of [0, n) in parts, with boundaries at multiples of
// align so that each part keeps the widest kernel blocks.
func partRange(n, p, parts, align int) (lo, hi int) {
	at := func(p int) int {
		if p == parts {
			return n
		}
		return n * p / parts / align * align
	}
	return at(p), at(p + 1)
}

// matmulJob is one matrix product split by output rows of w.
type matmulJob struct {
	out, x, w []float32
	in, outs  int
}

func (j *matmulJob) run(p, parts int) {
	lo, hi := partRange(j.outs, p, parts, 8)
	kern.matmul(j.out, j.x, j.w, j.in, j.outs, lo, hi)
}
