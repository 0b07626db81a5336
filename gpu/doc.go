// Package gpu finds the devices a node runs on, sizes the KV pool each of
// them can hold, and refuses to start a node whose pool cannot hold the
// context window it would advertise.
//
// # Common path
//
// Discover (with a DiscoveryConfig) returns the node's devices: NVML devices
// when the driver is present, otherwise, in auto mode, one CPU device whose
// memory budget comes from configuration. Under cgo, DiscoverNVML and
// DiscoverFrom take any nvml.Interface, so NVIDIA's mocks
// (pkg/nvml/mock/dgxa100, dgxh100, …) run exactly the code that nvml.New()
// runs. SizePool turns a Device and a SizingConfig into a PoolSize in
// pages, tokens and bytes, either from memory or from an explicit
// KVPoolTokens. Preflight (or PreflightAll) compares each pool with the
// advertised context window and returns a report per device; a pool that
// cannot hold one full-context request fails with a PoolTooSmallError that
// names both numbers and both fixes.
//
// NVML is reached only through cgo; a build with CGO_ENABLED=0 compiles a
// stub in which NVML is unavailable and auto discovery falls back to the CPU
// device. No NVML function is called after Init has failed, because the
// library then aborts the whole process.
//
// # The compute engine
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
// at a time. Sizing and preflight are pure functions of their arguments: no I/O, no
// clock, no shared state; call them from any goroutine. Discovery calls into
// NVML, which keeps process-wide state (Init and Shutdown are reference
// counted by the library): run one discovery at a time, at startup. Device,
// PoolSize and PreflightReport are plain values owned by the caller.
package gpu
