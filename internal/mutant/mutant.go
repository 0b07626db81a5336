// Package mutant names the planted bug a mutant build of kvwarden carries.
// A mutant is the real code with one guard removed, each re-creating a way
// this class of system has failed; it is built only with its build tag
// (go build -tags mutant_<name>), and the simulator and the chaos checker
// must catch every one (chaos/mutants.sh). A normal build has Active == ""
// and every mutant branch is dead code the compiler removes.
package mutant

// Names of the mutants, and the build tag of each: mutant_<name>.
const (
	// Incident is the incident's own bug: an oversize prompt is replaced
	// by a one-token placeholder whose KV is transferred as if it were the
	// whole prompt's, and decode reads the rest of its pages as they are.
	Incident = "incident"
	// NoTagCheck: a page takes any generation of its tag.
	NoTagCheck = "no_tag_check"
	// EarlyRelease: prefill frees its source pages as soon as the frames
	// are sent, before decode's ack.
	EarlyRelease = "early_release"
	// NoGenBump: a freed page keeps its generation.
	NoGenBump = "no_gen_bump"
	// ChecksumSkipsHeader: a page's checksum covers its bytes only, not
	// its tag, owner and token range.
	ChecksumSkipsHeader = "checksum_skips_header"
	// NoManifestVerify: decode skips the manifest's verification.
	NoManifestVerify = "no_manifest_verify"
	// AdmitIgnoresSmallestPool: admission checks the prompt against the
	// decode pool only, not the smaller prefill pool on its path.
	AdmitIgnoresSmallestPool = "admit_ignores_smallest_pool"
	// LateDoneAccepted: a request takes a TransferDone of an attempt it
	// abandoned.
	LateDoneAccepted = "late_done_accepted"
	// ScopeFromRequest: a prefix cache scope is the cache salt the
	// request sends, whoever its tenant is, as caches that take the salt
	// from the request do: one tenant can name another's scope.
	ScopeFromRequest = "scope_from_request"
	// EvictNoGenBump: an evicted cached page is freed without moving its
	// generation on.
	EvictNoGenBump = "evict_no_gen_bump"
	// LeaseCountNegative: an unlease of a shared lease does not check the
	// page's count of readers, which a repeated unlease takes below zero.
	LeaseCountNegative = "lease_count_negative"
	// KeyWithoutScope: a prefix key's root leaves the scope out, so every
	// scope's prompts share one chain of keys.
	KeyWithoutScope = "key_without_scope"
	// HeldCopyUnchecked: a page a decode node copied from its prefix
	// cache is sealed as it is, not only if it hashes to the cached
	// page's checksum.
	HeldCopyUnchecked = "held_copy_unchecked"
	// MoveEarlyRelease: the decode node a running request moves away from
	// gives its pages back once their frames are sent, before the target's
	// acknowledgement; a move that then fails decodes on over pages
	// another request may hold.
	MoveEarlyRelease = "move_early_release"
	// MoveReplay: the decode node a request moved to streams again, when
	// the stream is taken, the tokens its source had streamed.
	MoveReplay = "move_replay"
	// RelayUnhanded: a router's relay passes on chunks from any decode
	// node, not only the one its stream is on (was handed over to).
	RelayUnhanded = "relay_unhanded"
)

// Is reports whether this build carries mutant name. It is a constant
// expression, so a normal build compiles the guarded code only.
func Is(name string) bool { return Active == name }
