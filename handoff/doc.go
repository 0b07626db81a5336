// Package handoff holds the lifecycles of the prefill → decode handoff as
// pure state machines, in the shape of etcd raft's RawNode: a value is
// changed only by Step(event, now), which returns the effects the caller
// must carry out (reserve pages, send a plan, write frames, seal and
// verify, acknowledge, release, stream a token, answer the client, arm a
// timer). An effect whose outcome the machine needs is answered by a
// further event (Reserve by Reserved, Write by Written, SealVerify by
// Verified, Pick by Picked, Prefill by Prefilled, SendFrames by Sent).
// Nothing here has goroutines, a clock or I/O: protoactor actors (package
// actors) carry the effects out in a running node, and the deterministic
// simulator (package chaos/sim) carries them out over an in-memory network
// and clock, so that both run the same rules.
//
//   - Admit is the admission rule, the one function router and decode
//     admission both call: a prompt (with the tokens it asks for) must fit
//     the context window and the smallest pool on its path; Admission is
//     one decode node's in-flight bookkeeping around it.
//   - Request is one request's life on its decode node: reserve, plan,
//     accept frames only into its own pages and only from the planned
//     peer, seal against prefill's checksums, verify the manifest,
//     acknowledge, decode, stream, and release whatever it holds however
//     it ends; a transfer that fails before any token streamed is retried
//     with another prefill peer under a new attempt id.
//   - Source is one prefill worker's side of every transfer: the plan
//     queue, the sends in flight, the source pages awaiting decode's
//     acknowledgement, and the memory of plans that ended, so that a
//     duplicate plan is never prefilled twice and a source page is freed
//     only by the ack (or its reclaim deadline).
//   - PrefixCache is one worker's cache of prompt prefixes, scoped by the
//     credential's tenant (or its policy's group, narrowed by a salt). On
//     a prefill worker, ExecPrefillCached reads the longest cached run of a
//     prompt's full pages instead of computing it, and ExecAckKeep keeps a
//     prompt's new full pages as cached pages once decode has them. On a
//     decode worker, ExecReserveHeld copies the run it holds into a
//     request's pages (the plan's HeldPages, which prefill does not send),
//     and ExecKeep keeps an answered prompt's full pages.
//     PrefixAffinity is a router's (or dispatcher's) bounded guess of
//     which holder has which prompt's pages, within the prompt's scope.
//
// The page rules themselves (tags, owners, generations, checksums) are
// package kv's; ExecReserve, ExecWrite, ExecSealVerify and ExecRelease
// carry the page effects out against any Pages, so that every caller does
// them the same way.
package handoff
