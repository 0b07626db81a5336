package tenancy

import "math"

// Steps is a decode worker's share of its steps among tenants: which of
// its sequences each batched step takes, so that tenants share the
// worker's compute by weight instead of by how many sequences each has or
// how long they are. A tenant flooding a worker with many long-context
// sequences gets no more compute than its weight says while another
// tenant has sequences there, and no less when it is alone.
//
// It is stride scheduling over cost: each tenant with sequences has a
// pass, its compute so far divided by its weight, and each sequence a
// cost (what its step computes: engine.ModelConfig.TokenMACs). A step
// takes, again and again, the next sequence of the tenant of least pass,
// adding the sequence's cost over its weight to the pass, while that pass
// is within a window of the least pass the step began with (the lightest
// tenant's whole demand, over its weight), and the batch has room. A step
// so holds about the tenants' fair parts of it: a tenant whose sequences
// are few and short is stepped at every step, and a flood's long
// sequences take their turns at about as much compute per step (with
// equal weights), instead of all of them making every step long; tenants
// that all ask little are all stepped at once. The cost is an engine's
// whose step time grows with what it computes, as this repository's CPU
// engine's does; an engine whose batched step costs about the same
// whatever its size would weigh steps otherwise. A tenant's pass so stays within a step's worth
// of every other's: over many steps each gets compute in proportion to
// its weight. A tenant that comes (back) starts at the least pass, with no
// credit for the time it had nothing to run. Not safe for concurrent use.
type Steps struct {
	pass map[string]float64 // tenants with sequences at the last step
}

// NewSteps is a worker's share with no history.
func NewSteps() *Steps { return &Steps{pass: map[string]float64{}} }

// Choose appends to out the indexes of the sequences to step now, at most
// n, and returns it: sequence i is of tenants[i] and costs costs[i] (more
// than 0); weight gives a tenant's weight (taken as at least 1). Within a
// tenant, sequences go in their order, so a caller that rotates its
// sequences between steps steps each of a tenant's in turn. With one
// tenant, every sequence the batch has room for is chosen.
func (s *Steps) Choose(tenants []string, costs []float64, weight func(string) int, n int, out []int) []int {
	type queue struct {
		tenant string
		seqs   []int
		w      float64
	}
	var queues []*queue
	byTenant := map[string]*queue{}
	for i, t := range tenants {
		q := byTenant[t]
		if q == nil {
			q = &queue{tenant: t, w: float64(max(weight(t), 1))}
			byTenant[t], queues = q, append(queues, q)
		}
		q.seqs = append(q.seqs, i)
	}
	// Forget tenants with nothing to run; a new one starts at the least
	// pass of those that stay (0 when none).
	least := math.Inf(1)
	for t, p := range s.pass {
		if byTenant[t] == nil {
			delete(s.pass, t)
		} else {
			least = min(least, p)
		}
	}
	if math.IsInf(least, 1) {
		least = 0
	}
	for _, q := range queues {
		if _, ok := s.pass[q.tenant]; !ok {
			s.pass[q.tenant] = least
		}
	}
	// Passes relative to the least, so that they stay small numbers.
	for t := range s.pass {
		s.pass[t] -= least
	}
	// How far past the least pass a tenant may still take a sequence: the
	// lightest tenant's whole demand (its sequences' costs over its
	// weight), so that a step holds every sequence of a tenant that asks
	// little and about as much compute of each other tenant, and tenants
	// that all ask little fill the batch. Alone, a tenant has no one to be
	// fair to: it fills the batch.
	window := math.Inf(1)
	if len(queues) > 1 {
		for _, q := range queues {
			demand := 0.0
			for _, i := range q.seqs {
				demand += costs[i]
			}
			window = min(window, demand/q.w)
		}
	}
	for chosen := 0; chosen < n; chosen++ {
		var next *queue
		for _, q := range queues {
			if len(q.seqs) > 0 && s.pass[q.tenant] <= window && (next == nil || s.pass[q.tenant] < s.pass[next.tenant]) {
				next = q
			}
		}
		if next == nil {
			break
		}
		i := next.seqs[0]
		next.seqs = next.seqs[1:]
		s.pass[next.tenant] += costs[i] / next.w
		out = append(out, i)
	}
	return out
}
