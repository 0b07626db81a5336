package live

import (
	"github.com/kvwarden/kvwarden/chaos/faults"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/trust"
)

// PoolFigures are one pool's figures, read through node status.
type PoolFigures struct {
	Node     string `json:"node"`
	Pool     string `json:"pool"`
	Capacity int    `json:"capacity"`
	Free     int    `json:"free"`
	// CrossTenantRows and CrossRequestRows are rows the pool's reads
	// returned that another tenant, or another request of the same
	// tenant, wrote: counted by a chaos build only, and 0 in a correct
	// one.
	CrossTenantRows  uint64 `json:"cross_tenant_rows,omitempty"`
	CrossRequestRows uint64 `json:"cross_request_rows,omitempty"`
	// Cached is how many pages the pool's prefix cache keeps;
	// CacheQueryTokens the prompt tokens its lookups could have found,
	// CacheHitTokens those found (over the incarnation read).
	Cached           int    `json:"cached,omitempty"`
	CacheQueryTokens uint64 `json:"cache_query_tokens,omitempty"`
	CacheHitTokens   uint64 `json:"cache_hit_tokens,omitempty"`
}

// Leaked is how many of the pool's pages are neither free nor kept by its
// prefix cache.
func (p PoolFigures) Leaked() int { return p.Capacity - p.Free - p.Cached }

// NodeFigures are one node's figures, read through node status.
type NodeFigures struct {
	Name        string        `json:"name"`
	Role        string        `json:"role"`
	Incarnation uint64        `json:"incarnation"`
	Pools       []PoolFigures `json:"pools"`
	// Refused counts what the node refused, by trust.Refusal's name.
	Refused map[string]uint64 `json:"refused,omitempty"`
	// Chaos: the node is a chaos build. Faults is the in-node fault spec
	// it runs, FaultCounts the faults it injected by faults.Kind's name.
	Chaos       bool              `json:"chaos,omitempty"`
	Faults      string            `json:"faults,omitempty"`
	FaultCounts map[string]uint64 `json:"fault_counts,omitempty"`
	// MovedOut and MovedIn count the running requests a decode node moved
	// to another, KV and all, and took over from another; StreamsMoved
	// the streams a router's relays followed from one decode node to
	// another (over the incarnation read).
	MovedOut     uint64 `json:"moved_out,omitempty"`
	MovedIn      uint64 `json:"moved_in,omitempty"`
	StreamsMoved uint64 `json:"streams_moved,omitempty"`
}

// FiguresOf reads the figures of the node named name from its status.
func FiguresOf(name string, s *messages.StatusReply) NodeFigures {
	n := NodeFigures{Name: name, Role: s.Node.Role, Incarnation: s.Node.Incarnation, Refused: refusedOf(s.Node.Refused),
		Chaos: s.Node.Chaos, Faults: s.Node.Faults, MovedOut: s.Node.MovedOut, MovedIn: s.Node.MovedIn,
		StreamsMoved: s.Node.StreamsMoved}
	for _, p := range s.Node.Pools {
		n.Pools = append(n.Pools, PoolFigures{Node: name, Pool: p.Name, Capacity: int(p.Capacity), Free: int(p.Free),
			CrossTenantRows: p.CrossTenantRows, CrossRequestRows: p.CrossRequestRows, Cached: int(p.CachePages),
			CacheQueryTokens: p.CacheQueryTokens, CacheHitTokens: p.CacheHitTokens})
	}
	for k, c := range s.Node.FaultCounts {
		if k < faults.NumKinds && c > 0 {
			if n.FaultCounts == nil {
				n.FaultCounts = map[string]uint64{}
			}
			n.FaultCounts[faults.Kind(k).String()] = c
		}
	}
	return n
}

// refusedOf names NodeStatus.Refused's counts by kind.
func refusedOf(counts []uint64) map[string]uint64 {
	names := trust.RefusalNames()
	out := map[string]uint64{}
	for i, n := range counts {
		if i < len(names) && n > 0 {
			out[names[i]] = n
		}
	}
	return out
}

// refusedCount is the count of kind r in a node's status.
func refusedCount(s *messages.StatusReply, r trust.Refusal) uint64 {
	if int(r) < len(s.Node.Refused) {
		return s.Node.Refused[r]
	}
	return 0
}
