// Package faults is the in-node fault injection of a chaos build: the
// spec of which faults a node injects and how often, and the injector
// that the KV data plane's sender and the transfer acknowledgements ask,
// frame by frame, what to do.
//
// # Common path
//
// A chaos tester starts a node built with `go build -tags chaos ./cmd/node`
// as `node run --faults seed=7,frame-drop=0.02,ack-drop=0.01`. The node
// parses the spec (Parse), makes an Injector from it (New) and installs it
// for the process (Install) before it serves. From then on every batch of
// KV frames the node sends to a peer's data plane passes through
// Injector.Frames (drop, duplicate, reorder, misdirect) and each payload
// through Injector.Corrupt (one bit flipped after the frame's checksum was
// computed, so that the receiver's checksum refuses it); each transfer
// acknowledgement asks Injector.DropAck. Injector.Counts says how many
// faults of each kind were injected; node status reports them.
//
// # Builds
//
// Only a chaos build has fault points. In a production build Available
// is false, New refuses every spec with an *UnavailableError that says how
// to build a node that has them, Current is always nil and the Injector's
// methods, which every caller reaches through Current, change nothing: the
// compiler removes the calls. Spec, Parse and the kinds exist in both
// builds, so that a production binary can name and refuse a spec and read
// another node's counts.
//
// # Concurrency and determinism
//
// An Injector is safe for concurrent use. All its randomness comes from one
// PCG generator seeded by Spec.Seed, drawn under a lock: the same sequence
// of calls gives the same faults, so a run on one sender replays from its
// seed. Concurrent senders interleave their draws in the order they take
// the lock, which the seed does not fix.
package faults
