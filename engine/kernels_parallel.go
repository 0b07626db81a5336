package engine

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
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

// helperCall is one part of a job, for a helper.
type helperCall struct {
	j           job
	part, parts int
	wg          *sync.WaitGroup
}

// helperSpin is how long a helper that ran a part keeps looking for the
// next before it parks. A parked helper, readied by the caller, waits in
// the caller's processor's run queue until the caller blocks: measured
// here, its part then starts only when the caller's has ended, and a
// split gains nothing. The parts of one pass come microseconds apart, so
// a helper that looks for a while runs every part of a pass but the
// first beside the caller; between passes it parks, and costs no CPU.
const helperSpin = 50 * time.Microsecond

// helper is a goroutine that runs parts of jobs, one at a time. A caller
// claims it, sets call, then posted; the helper takes the call, clears
// both, and runs it. A parked helper is woken through wake.
type helper struct {
	claimed, posted, parked atomic.Bool
	call                    helperCall
	wake                    chan struct{}
}

// helpers are the goroutines that run parts of jobs; there is one fewer
// than the processors Go runs on, since the caller runs a part too.
var helpers struct {
	once sync.Once
	all  []*helper
}

func startHelpers() {
	for range min(runtime.GOMAXPROCS(0), partsMax) - 1 {
		h := &helper{wake: make(chan struct{}, 1)}
		helpers.all = append(helpers.all, h)
		go h.loop()
	}
}

// loop runs the parts posted to h, looking for the next for helperSpin
// after each (yielding to the other goroutines of its processor), then
// parks until woken.
func (h *helper) loop() {
	for {
		for until := time.Now().Add(helperSpin); time.Now().Before(until); {
			if h.take() {
				until = time.Now().Add(helperSpin)
				continue
			}
			runtime.Gosched()
		}
		// A caller posts, then reads parked; the helper sets parked, then
		// reads posted: one of the two sees the other.
		h.parked.Store(true)
		if !h.take() {
			<-h.wake
		}
		h.parked.Store(false)
	}
}

// take runs the part posted to h, if one is, and says whether it did.
func (h *helper) take() bool {
	if !h.posted.Load() {
		return false
	}
	c := h.call
	h.call = helperCall{}
	h.posted.Store(false)
	h.claimed.Store(false)
	c.j.run(c.part, c.parts)
	c.wg.Done()
	return true
}

// post gives h the part c unless another caller holds h, and wakes h if
// it parked.
func (h *helper) post(c helperCall) bool {
	if !h.claimed.CompareAndSwap(false, true) {
		return false
	}
	h.call = c
	h.posted.Store(true)
	if h.parked.Load() {
		select {
		case h.wake <- struct{}{}:
		default: // a wake is pending already
		}
	}
	return true
}

// splitParts is how many parts work of size work splits into, given the
// size least below which splitting does not pay.
func splitParts(work, least int) int {
	if work < least {
		return 1
	}
	helpers.once.Do(startHelpers)
	return len(helpers.all) + 1
}

// split runs the parts of j and returns when all have run: part p on
// helper p-1, part 0 on the caller. A part whose helper is held (another
// engine's step posted to it) or missing runs on the caller; wg is the
// caller's, so that waiting allocates nothing.
func split(j job, parts int, wg *sync.WaitGroup) {
	for p := 1; p < parts; p++ {
		wg.Add(1)
		if p > len(helpers.all) || !helpers.all[p-1].post(helperCall{j: j, part: p, parts: parts, wg: wg}) {
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
	out, x []float32
	w      *Matrix
}

func (j *matmulJob) run(p, parts int) {
	lo, hi := partRange(j.w.Rows, p, parts, 8)
	kern.matmulM(j.out, j.x, j.w, lo, hi)
}
