package bench

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
)

// LengthMax bounds every length a Dist draws: more than any context window
// a node serves, so that a typo is refused here, not by every request.
const LengthMax = 1 << 20

// Dist is a distribution of lengths (prompt bytes, output tokens):
// uniform over [Min, Max], fixed when Min equals Max.
type Dist struct {
	Min, Max int
}

// Fixed is the distribution that always draws n.
func Fixed(n int) Dist { return Dist{n, n} }

// ParseDist reads "N" or "fixed:N" (always N) and "uniform:A:B" (every
// length from A to B alike), each length 1 to LengthMax.
func ParseDist(s string) (Dist, error) {
	parts := strings.Split(s, ":")
	bad := func(reason string) (Dist, error) { return Dist{}, &SpecError{Spec: s, Reason: reason} }
	nums := make([]int, 0, 2)
	kind := "fixed"
	if len(parts) > 1 {
		kind, parts = parts[0], parts[1:]
	}
	for _, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil {
			return bad(fmt.Sprintf("%q is not a whole number", p))
		}
		nums = append(nums, n)
	}
	var d Dist
	switch {
	case kind == "fixed" && len(nums) == 1:
		d = Fixed(nums[0])
	case kind == "uniform" && len(nums) == 2:
		d = Dist{nums[0], nums[1]}
	default:
		return bad(`want N, fixed:N or uniform:MIN:MAX`)
	}
	return d, d.Validate()
}

// Validate refuses lengths below 1, above LengthMax, or Min above Max.
func (d Dist) Validate() error {
	switch {
	case d.Min < 1 || d.Min > LengthMax:
		return &RangeError{What: "the least length of " + d.String(), Value: float64(d.Min), Min: 1, Max: LengthMax}
	case d.Max < d.Min || d.Max > LengthMax:
		return &RangeError{What: "the greatest length of " + d.String(), Value: float64(d.Max), Min: float64(d.Min), Max: LengthMax}
	}
	return nil
}

// Draw is one length.
func (d Dist) Draw(r *rand.Rand) int {
	if d.Min == d.Max {
		return d.Min
	}
	return d.Min + r.IntN(d.Max-d.Min+1)
}

// Mean is the distribution's mean.
func (d Dist) Mean() float64 { return float64(d.Min+d.Max) / 2 }

// String is the distribution as ParseDist reads it.
func (d Dist) String() string {
	if d.Min == d.Max {
		return strconv.Itoa(d.Min)
	}
	return fmt.Sprintf("uniform:%d:%d", d.Min, d.Max)
}

// SpecError is a flag value or a file line that does not parse.
type SpecError struct {
	Spec, Reason string
}

func (e *SpecError) Error() string { return fmt.Sprintf("bench: %q: %s", e.Spec, e.Reason) }

// RangeError is a number outside the range it must be in.
type RangeError struct {
	What            string
	Value, Min, Max float64
}

func (e *RangeError) Error() string {
	return fmt.Sprintf("bench: %s: %g is outside [%g, %g]", e.What, e.Value, e.Min, e.Max)
}
