package trust

import "log/slog"

// Refusal is why something from outside was refused. The values are
// stable: status reports counts by them.
type Refusal uint8

const (
	// RefusedCertificate: TLS handshake with no, an expired or a foreign
	// certificate.
	RefusedCertificate Refusal = iota
	// RefusedAddress: a protoactor sender address whose server is not the
	// certificate holder.
	RefusedAddress
	// RefusedBatch: a malformed protoactor batch (index out of range,
	// unknown type, no sender, a target elsewhere, before connecting).
	RefusedBatch
	// RefusedPanic: a panic while handling a peer's stream, recovered.
	RefusedPanic
	// RefusedRole: a message only another role may send.
	RefusedRole
	// RefusedTenant: a request for a tenant its credential does not name.
	RefusedTenant
	// RefusedStranger: tokens, a result, frames or a transfer report from
	// a peer the request was not sent to or planned with, or out of
	// sequence.
	RefusedStranger
	// RefusedDataPlane: a data-plane connection refused (no hello in time,
	// too many from one peer, a refused batch).
	RefusedDataPlane
	// RefusedHTTP: an HTTP connection or request refused by a bound of the
	// HTTP server on strangers (connections in all or from one address,
	// repeated bad API keys from one address).
	RefusedHTTP
	// RefusedClaimProbes: a claimed address not probed, because every
	// claim probe the claimant may use was under way for as long as a
	// probe takes (ClaimProbesMax; a tenant's share leaves
	// ClaimProbesReserved to the cluster's own).
	RefusedClaimProbes
	// RefusedClaimPeer: a claimed address not probed, because the
	// claimant's identity (ClaimProbesPerIdentityMax) or its network
	// address (ClaimProbesPerAddrMax) had all its probes under way.
	RefusedClaimPeer
	// RefusedClaimRemembered: a claim whose probe failed within
	// ClaimFailureTTL, refused again without a probe.
	RefusedClaimRemembered
	// RefusedHandshakes: a connection closed before it proved an identity,
	// because the listener held every connection it may before theirs (of
	// a stranger's address, all but the reserved share).
	RefusedHandshakes
	// RefusedHandshakesAddr: a connection closed before it proved an
	// identity, because its network address held every connection one
	// address may before theirs.
	RefusedHandshakesAddr
	refusalKinds
)

var refusalNames = [refusalKinds]string{"certificate", "address", "batch", "panic", "role", "tenant", "stranger",
	"data_plane", "http", "claim_probes", "claim_probes_peer", "claim_remembered", "handshakes", "handshakes_addr"}

func (r Refusal) String() string {
	if r < refusalKinds {
		return refusalNames[r]
	}
	return "unknown"
}

// Refusals are counts by Refusal, indexed by its value.
type Refusals [refusalKinds]uint64

// Total is the sum of all counts.
func (r Refusals) Total() uint64 {
	var t uint64
	for _, n := range r {
		t += n
	}
	return t
}

// Refuse counts a refusal and logs it with what was refused, at most
// RefusalLinesPerSecond lines a second for each kind of refusal.
func (a *Authority) Refuse(r Refusal, what string, args ...any) {
	a.refused[r].Add(1)
	a.lines.Log(a.log, slog.LevelWarn, r.String(), "refused: "+what, append([]any{slog.String("reason", r.String())}, args...)...)
}

// Warn writes to log a line a peer can cause that refuses nothing (a read
// or a write on its connection that failed), at most
// RefusalLinesPerSecond lines a second for each kind; the caller counts
// what happened.
func (a *Authority) Warn(log *slog.Logger, kind, msg string, args ...any) {
	a.lines.Log(log, slog.LevelWarn, "warn:"+kind, msg, args...)
}

// Refused is the count of every refusal so far.
func (a *Authority) Refused() Refusals {
	var out Refusals
	for i := range out {
		out[i] = a.refused[i].Load()
	}
	return out
}

// RefusalNames are the names of Refusals' indexes, in order.
func RefusalNames() []string { return refusalNames[:] }
