package sim

import (
	"runtime"
	"slices"
	"sync"
	"time"
)

// Campaign is a sweep over many seeds.
type Campaign struct {
	// First is the first seed; seeds follow it in order.
	First uint64
	// Seeds is how many seeds to run; with Duration set, seeds are run
	// until Duration has passed instead (Seeds 0) or whichever comes last.
	Seeds    int
	Duration time.Duration
	// Workers run seeds in parallel, 0 for GOMAXPROCS.
	Workers int
	// StopAtFirst stops at the first failing seed: every seed before it
	// is still run, so that the seed reported is the first in order.
	StopAtFirst bool
	// FailuresMax bounds the failures kept, the first seeds first; 0 keeps
	// 10.
	FailuresMax int
}

// Summary is what a campaign found.
type Summary struct {
	// Seeds run, Steps and Requests summed over them.
	Seeds    int
	Steps    int64
	Requests int
	Outcomes map[string]int
	Counters Counters
	// Failures are the failing runs, in seed order.
	Failures []Result
	// Wall is the wall-clock time the campaign took.
	Wall time.Duration
}

// Sweep runs opt for every seed of c and sums what the runs found.
func Sweep(opt Options, c Campaign) Summary {
	workers := c.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	keep := c.FailuresMax
	if keep <= 0 {
		keep = 10
	}
	start := time.Now()
	var (
		mu      sync.Mutex
		next    = c.First
		stopAt  = ^uint64(0) // the first failing seed when StopAtFirst
		sum     = Summary{Outcomes: map[string]int{}}
		wg      sync.WaitGroup
		claimed = func() (uint64, bool) {
			mu.Lock()
			defer mu.Unlock()
			n := int(next - c.First)
			more := n < c.Seeds || c.Duration > 0 && time.Since(start) < c.Duration
			if !more || next >= stopAt {
				return 0, false
			}
			next++
			return next - 1, true
		}
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				seed, ok := claimed()
				if !ok {
					return
				}
				r := Run(seed, opt)
				mu.Lock()
				sum.add(r)
				if r.Violation != nil && c.StopAtFirst && seed < stopAt {
					stopAt = seed
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	slices.SortFunc(sum.Failures, func(a, b Result) int {
		if a.Seed < b.Seed {
			return -1
		}
		return 1
	})
	if c.StopAtFirst && stopAt != ^uint64(0) {
		sum.Seeds = int(stopAt - c.First + 1) // the seeds up to the first failure
	}
	if len(sum.Failures) > keep {
		sum.Failures = sum.Failures[:keep]
	}
	sum.Wall = time.Since(start)
	return sum
}

func (s *Summary) add(r Result) {
	s.Seeds++
	s.Steps += int64(r.Steps)
	s.Requests += r.Requests
	for k, v := range r.Outcomes {
		s.Outcomes[k] += v
	}
	s.Counters.Add(r.Counters)
	if r.Violation != nil {
		s.Failures = append(s.Failures, r)
	}
}
