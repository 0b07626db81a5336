// Package llamacpp asks llama.cpp itself what a GGUF model says, so that
// tests and benchmarks can hold kvwarden's engine against it: the token
// ids of a text, greedy decoding with each step's most likely tokens, the
// next-token distribution at every position of a given sequence (teacher
// forcing), and single-stream decode speed.
//
// llama.cpp runs on the CPU only, from node-llama-cpp's prebuilt binaries
// (npm, pinned in tools/llamacpp/package.json), through the Node script
// tools/llamacpp/run.mjs: one process per call, a JSON request on its
// stdin, one JSON reply on its stdout. Nothing is compiled or downloaded
// at run time. Find locates node and the installation; without one it
// returns a *NotInstalledError that says how to install it
// (bash tools/llamacpp/install.sh).
//
// Scores are log-probabilities, not raw logits: node-llama-cpp 3.21.1
// gives JavaScript only the softmax of the logits. A log-probability is
// the logit less the logsumexp of the position's logits, so differences
// between two tokens' scores at a position are differences of logits.
//
// Every call has a deadline (the context's, or Harness.Timeout): a node
// process that outlives it is killed and the error says what was awaited.
// Replies are bounded (Harness.OutputMax) and stderr is kept for errors.
// A Harness holds no state between calls and may be used concurrently;
// each call pays node's start, node-llama-cpp's check of its binary
// in a child process and the model's load (about 0.7 s here).
//
// The tests run against ../shared/models/stories260K: without an
// installation they are skipped, and with KVWARDEN_REQUIRE_LLAMACPP=1 (CI)
// they fail instead.
package llamacpp
