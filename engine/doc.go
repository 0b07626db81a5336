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
// ReferenceEngine computes a Llama-architecture transformer (RMSNorm,
// rotary positions on adjacent pairs, grouped-query attention, SwiGLU) in
// float32 on the CPU. Reference computes the same greedy continuation with
// one contiguous in-memory KV cache and is the single-node oracle: any
// path, over any pages in any pool, batched or not, must equal it bit for
// bit. Every sum has one order, which the generic Go kernels define and the
// vector kernels reproduce; multiply-adds are never fused and exp is
// computed in the package, so the result does not depend on the CPU's
// vector width, fused-multiply-add or math assembly.
//
// # Models and tokens
//
// A Model is what a node serves: config, Weights (llama2.c's layout), the
// Tokenizer that defines its tokens, and a Fingerprint of all three with
// the KV type. BuiltinModel generates weights from the config's seed and
// uses the ByteTokenizer: no files, noise for text, fast for tests.
// LoadModel reads a llama2.c checkpoint (ReadCheckpoint: the legacy format
// or the versioned float32 export) and its tokenizer.bin (ReadTokenizer:
// SentencePiece-style BPE with byte fallback): every header value and the
// file size the header implies are checked before the arrays are
// allocated, and every weight before the model serves. Every prompt starts with the tokenizer's BOS;
// generation ends at its Stop token; TextDecoder joins the byte pieces of
// streamed tokens into UTF-8.
//
// # Concurrency and ownership
//
// Sequences, like the pool they read, are used by one goroutine at a time.
// A Model, its weights, its tokenizer and its engine are immutable once
// built and shared by every worker of a node; Reference and Model.Answer
// may be called from any number of goroutines at once.
package engine
