package bench

import (
	"fmt"
	"slices"
)

// DecodeRate is a node's decode speed stepping Batch sequences at once:
// TokensPerS tokens a second over all of them together.
type DecodeRate struct {
	Batch      int     `json:"batch"`
	TokensPerS float64 `json:"tokens_per_s"`
}

// Profile is what one node does, measured: the planner's inputs.
type Profile struct {
	// PrefillTokensPerS is how fast one node computes a prompt's KV.
	PrefillTokensPerS float64 `json:"prefill_tokens_per_s"`
	// Decode is the decode speed at each batch size measured, by batch.
	Decode []DecodeRate `json:"decode"`
	// KVBytesPerToken is one token's K and V over every layer.
	KVBytesPerToken float64 `json:"kv_bytes_per_token"`
	// TransferBytesPerS is how fast KV moves from a prefill node to a
	// decode node.
	TransferBytesPerS float64 `json:"transfer_bytes_per_s"`
	// OverheadS is what a request spends, before its first token, outside
	// prefill and transfer: the hops through router, admission and plan,
	// and back to the client.
	OverheadS float64 `json:"overhead_s"`
	// BatchMax is the most sequences one decode step takes (the nodes'
	// --batch-max).
	BatchMax int `json:"batch_max"`
}

// ProfileRatesMax bounds the decode rates of a profile.
const ProfileRatesMax = 64

// Validate refuses a profile the model cannot run on.
func (p Profile) Validate() error {
	for _, f := range []struct {
		what string
		v    float64
	}{{"prefill_tokens_per_s", p.PrefillTokensPerS}, {"kv_bytes_per_token", p.KVBytesPerToken},
		{"transfer_bytes_per_s", p.TransferBytesPerS}, {"batch_max", float64(p.BatchMax)}} {
		if !(f.v > 0) || f.v > 1e15 {
			return &RangeError{What: "the profile's " + f.what, Value: f.v, Min: 0, Max: 1e15}
		}
	}
	if !(p.OverheadS >= 0) || p.OverheadS > 60 {
		return &RangeError{What: "the profile's overhead_s", Value: p.OverheadS, Min: 0, Max: 60}
	}
	if len(p.Decode) == 0 || len(p.Decode) > ProfileRatesMax {
		return &RangeError{What: "the profile's decode rates", Value: float64(len(p.Decode)), Min: 1, Max: ProfileRatesMax}
	}
	for i, d := range p.Decode {
		if d.Batch < 1 || !(d.TokensPerS > 0) || (i > 0 && d.Batch <= p.Decode[i-1].Batch) {
			return &SpecError{Spec: fmt.Sprintf("decode rate %d (batch %d, %g tokens/s)", i, d.Batch, d.TokensPerS),
				Reason: "want batches of 1 or more in increasing order, each at a positive rate"}
		}
	}
	return nil
}

// StepS is how long one decode step of batch sequences takes, in
// seconds: batch over the rate at that batch, linear between the batches
// measured, the first's below them and extended along the last two beyond.
func (p Profile) StepS(batch int) float64 {
	step := func(d DecodeRate) float64 { return float64(d.Batch) / d.TokensPerS }
	ds := p.Decode
	i, found := slices.BinarySearchFunc(ds, batch, func(d DecodeRate, b int) int { return d.Batch - b })
	switch {
	case found:
		return step(ds[i])
	case i == 0:
		return step(ds[0])
	case i == len(ds) && len(ds) == 1:
		return step(ds[0])
	case i == len(ds):
		i = len(ds) - 1
	}
	a, b := ds[i-1], ds[i]
	sa, sb := step(a), step(b)
	return sa + (sb-sa)*float64(batch-a.Batch)/float64(b.Batch-a.Batch)
}

// PrefillS is how long one node takes to prefill tokens.
func (p Profile) PrefillS(tokens int) float64 { return float64(tokens) / p.PrefillTokensPerS }

// TransferS is how long tokens' KV takes to move between nodes.
func (p Profile) TransferS(tokens int) float64 {
	return float64(tokens) * p.KVBytesPerToken / p.TransferBytesPerS
}
