package bench

import (
	"math"
	"slices"
	"time"
)

// Separation is how well a time tells two kinds of request apart (a
// prefix cache's hits from its misses, by time to first token): the area
// under the ROC curve of calling the faster of a pair the hit, with its
// spread. An AUC of 0.5 is a coin's; 1 tells every pair apart.
type Separation struct {
	// Hits and Misses are how many of each were timed.
	Hits   int `json:"hits"`
	Misses int `json:"misses"`
	// AUC is the chance that a miss drawn at random took longer than a
	// hit drawn at random, ties counting half (the Mann-Whitney U over
	// Hits × Misses).
	AUC float64 `json:"auc"`
	// Low and High bound AUC's 95 % confidence interval, from Hanley and
	// McNeil's (1982) standard error, within [0, 1].
	Low  float64 `json:"ci95_low"`
	High float64 `json:"ci95_high"`
	// ChanceLow and ChanceHigh bound where 95 % of AUCs fall when the
	// times tell nothing (hits and misses drawn alike): the Mann-Whitney
	// U's variance under that hypothesis. An AUC inside is
	// indistinguishable from chance at this many trials.
	ChanceLow  float64 `json:"chance95_low"`
	ChanceHigh float64 `json:"chance95_high"`
}

// z95 is the standard normal's two-sided 95 % quantile.
const z95 = 1.959963984540054

// Separate is the separation of hits from misses by their times; the
// zero Separation (AUC NaN) when either is empty.
func Separate(hits, misses []time.Duration) Separation {
	s := Separation{Hits: len(hits), Misses: len(misses), AUC: math.NaN()}
	if len(hits) == 0 || len(misses) == 0 {
		return s
	}
	// Rank every time, ties taking the mean of their ranks; U counts the
	// pairs in which the miss is the slower from the misses' rank sum.
	type timed struct {
		d    time.Duration
		miss bool
	}
	all := make([]timed, 0, len(hits)+len(misses))
	for _, d := range hits {
		all = append(all, timed{d, false})
	}
	for _, d := range misses {
		all = append(all, timed{d, true})
	}
	slices.SortFunc(all, func(a, b timed) int { return int(min(max(a.d-b.d, -1), 1)) })
	rankSum := 0.0
	for i := 0; i < len(all); {
		j := i
		for j < len(all) && all[j].d == all[i].d {
			j++
		}
		rank := float64(i+j+1) / 2 // ranks i+1 … j, their mean
		for _, x := range all[i:j] {
			if x.miss {
				rankSum += rank
			}
		}
		i = j
	}
	n1, n2 := float64(len(hits)), float64(len(misses))
	u := rankSum - n2*(n2+1)/2
	a := u / (n1 * n2)
	s.AUC = a
	q1, q2 := a/(2-a), 2*a*a/(1+a)
	se := math.Sqrt(max(a*(1-a)+(n1-1)*(q1-a*a)+(n2-1)*(q2-a*a), 0) / (n1 * n2))
	s.Low, s.High = max(a-z95*se, 0), min(a+z95*se, 1)
	chance := math.Sqrt((n1 + n2 + 1) / (12 * n1 * n2))
	s.ChanceLow, s.ChanceHigh = 0.5-z95*chance, 0.5+z95*chance
	return s
}
