package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// Bounds of a run's schedule.
const (
	// RatePerSMax bounds a request rate.
	RatePerSMax = 1e6
	// RequestsMax bounds the requests of one run.
	RequestsMax = 1 << 22
)

// Bound ends a run: after Requests requests, or when Duration has passed,
// whichever comes first (zero: no such bound; one must be given). Both
// count after the warm-up.
type Bound struct {
	Duration time.Duration
	Requests int
}

// Validate refuses a bound that never ends a run, or one beyond
// RequestsMax.
func (b Bound) Validate() error {
	if b.Duration < 0 || b.Requests < 0 || (b.Duration == 0 && b.Requests == 0) || b.Requests > RequestsMax {
		return &RangeError{What: "the run's bound (requests, with a duration of " + b.Duration.String() + ")",
			Value: float64(b.Requests), Min: 0, Max: RequestsMax}
	}
	return nil
}

// Poisson is the send times, as offsets from the run's start, of an
// open-loop run at ratePerS requests a second (exponential gaps drawn from
// seed): those within warmup, then those within bound, at most
// RequestsMax. warm is how many of them fall within the warm-up.
func Poisson(seed uint64, ratePerS float64, warmup time.Duration, bound Bound) (at []time.Duration, warm int) {
	r := rand.New(rand.NewPCG(seed, streamArrivals))
	t := 0.0
	for len(at) < RequestsMax {
		t += r.ExpFloat64() / ratePerS
		d := time.Duration(t * float64(time.Second))
		measured := len(at) - warm
		if d < warmup {
			warm++
		} else if (bound.Requests > 0 && measured >= bound.Requests) || (bound.Duration > 0 && d >= warmup+bound.Duration) {
			break
		}
		at = append(at, d)
	}
	return at, warm
}

// CheckRate refuses a rate that is not positive or beyond RatePerSMax.
func CheckRate(ratePerS float64) error {
	if !(ratePerS > 0) || ratePerS > RatePerSMax || math.IsInf(ratePerS, 0) {
		return &RangeError{What: "request rate per second", Value: ratePerS, Min: 0, Max: RatePerSMax}
	}
	return nil
}

// CheckSchedule refuses a rate CheckRate refuses, and an open-loop run at
// ratePerS whose warm-up and bound would send more than RequestsMax
// requests on average: Poisson stops there, and the run would end long
// before its duration without a word.
func CheckSchedule(ratePerS float64, warmup time.Duration, b Bound) error {
	if err := CheckRate(ratePerS); err != nil {
		return err
	}
	sends := math.Inf(1)
	if b.Duration > 0 {
		sends = ratePerS * (warmup + b.Duration).Seconds()
	}
	if b.Requests > 0 {
		sends = min(sends, ratePerS*warmup.Seconds()+float64(b.Requests))
	}
	if sends > RequestsMax {
		return &RangeError{What: fmt.Sprintf("requests sent at %g a second over a warm-up of %s and a bound of %d requests or %s",
			ratePerS, warmup, b.Requests, b.Duration), Value: math.Round(sends), Min: 1, Max: RequestsMax}
	}
	return nil
}
