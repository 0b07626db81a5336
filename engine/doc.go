// Package engine computes a transformer over the paged KV of one pool.
//
// An Engine runs a model over the paged KV of one pool and touches KV only
// through the pool's checked calls (the KV interface: a kv.Pool, or a client
// of page actors). Prefill computes a prompt's KV, writes it to the
// request's reserved tags (each page bound to its sequence position), seals
// every page and returns the first greedy token with the manifest. Decode
// verifies a manifest, leases its pages in manifest order and returns a
// Sequence. Each Sequence.Step reads every page again through its lease,
// attends over the pages and then a request-local tail, and returns the
// next greedy token. When the tail holds a full page, the Sequence reports
// NeedsPage with the position the page must start at; the caller reserves
// and grants it, and the next Step writes, seals and leases it. An Engine
// keeps no per-request state, so sequences of many requests interleave on
// one engine.
//
// ReferenceEngine is the built-in engine: a small transformer (RMSNorm,
// rotary positions, grouped-query attention, SwiGLU) in pure-Go float32,
// with weights generated from a seed and a byte-level tokenizer. Reference
// computes the same greedy continuation with one contiguous in-memory KV
// cache and is the single-node oracle: any path, over any pages in any
// pool, must equal it bit for bit. Multiply-adds are never fused and exp is
// computed in the package, so the result does not depend on the CPU's
// fused-multiply-add or math assembly.
//
// # Concurrency and ownership
//
// Engines and sequences, like the pool they read, are used by one goroutine
// at a time. The weights are immutable once built and shared by every
// engine and sequence of a node.
package engine
