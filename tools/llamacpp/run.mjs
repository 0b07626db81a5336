// run.mjs: llama.cpp, through node-llama-cpp's prebuilt CPU binaries, as the
// reference that kvwarden's engine is checked against.
//
//   node run.mjs COMMAND [--flag value ...]    or    node run.mjs COMMAND < request.json
//
// Commands: info, tokenize, vocab, greedy, forced, bench (see usage below).
// One JSON object goes to stdout; an error goes to stderr with exit status 1
// (2 for a bad request). Requests use the JSON keys listed in usage; the
// flags are the same names with "-" for "_", and token lists as "1,2,3".
//
// Scores are log-probabilities, not raw logits: node-llama-cpp 3.21.1 hands
// JavaScript only softmax(logits) (float32) from its sampler, never the
// logits. With temperature 0 and no penalties, bias or grammar the sampler
// chain is llama.cpp's greedy sampler alone, which leaves the logits as
// llama_get_logits_ith gave them, so log(p) = logit - logsumexp(logits).
import {existsSync, readFileSync} from "node:fs";
import {basename} from "node:path";
import {parseArgs} from "node:util";
import {getLlama} from "node-llama-cpp";

const usage = `usage: node run.mjs COMMAND [flags] (or a JSON request on stdin)
  info                                   versions and the CPU library ggml picks
  tokenize --model M --text T [--special]   BOS (when the model adds one) + llama.cpp's tokens of T
  vocab    --model M                     the GGUF's token pieces, scores and types
  greedy   --model M --prompt IDS --n N --threads T [--top-k K]
  forced   --model M --tokens IDS --threads T [--top-k K]
  bench    --model M --prompt IDS --n N --threads T [--runs R]
common: [--context-size C] (default: the model's) [--kv-type f16|f32] (default f16, llama.cpp's)
        [--flash-attention] (default off)`;

const flags = {
  model: "string", text: "string", special: "boolean", prompt: "ids", tokens: "ids", n: "number",
  threads: "number", "top-k": "number", runs: "number", "context-size": "number", "kv-type": "string",
  "flash-attention": "boolean",
};

// node-llama-cpp's own version, for the reply: its package.json is not
// among the package's exports, so it is read as a file.
const nodeLlamaCppVersion = JSON.parse(readFileSync(
  new URL("./node_modules/node-llama-cpp/package.json", import.meta.url), "utf8")).version;

class RequestError extends Error {}

const commands = {info, tokenize, vocab, greedy, forced, bench};

// The reply is written and flushed before exiting: stdout to a pipe is
// asynchronous in Node past the pipe's buffer (64 KiB), and process.exit
// would cut it short. Exiting, rather than disposing, ends llama.cpp's
// threads without waiting on them.
let status = 0, out = process.stdout, text;
try {
  const [name, ...args] = process.argv.slice(2);
  const command = commands[name];
  if (command === undefined) throw new RequestError(`unknown command ${JSON.stringify(name)}\n${usage}`);
  text = JSON.stringify(await command(await readRequest(name, args))) + "\n";
} catch (err) {
  status = err instanceof RequestError ? 2 : 1;
  out = process.stderr;
  text = `run.mjs: ${err instanceof RequestError ? err.message : err.stack}\n`;
}
out.write(text, () => process.exit(status));

async function readRequest(name, args) {
  if (args.length > 0 || name === "info") {
    let values;
    try {
      values = parseArgs({args, options: Object.fromEntries(
        Object.entries(flags).map(([k, type]) => [k, {type: type === "boolean" ? "boolean" : "string"}]))}).values;
    } catch (err) {
      throw new RequestError(`${err.message}\n${usage}`);
    }
    const convert = {ids: (v) => v.split(",").map(Number), number: Number};
    return Object.fromEntries(Object.entries(values).map(([k, v]) =>
      [k.replaceAll("-", "_"), convert[flags[k]]?.(v) ?? v]));
  }
  if (process.stdin.isTTY) throw new RequestError(`no flags and no request on stdin\n${usage}`);
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  try {
    return JSON.parse(Buffer.concat(chunks).toString("utf8"));
  } catch (err) {
    throw new RequestError(`the request on stdin is not JSON: ${err.message}`);
  }
}

function integer(req, key, min, max, fallback) {
  const v = req[key] ?? fallback;
  if (!Number.isInteger(v) || v < min || v > max)
    throw new RequestError(`${key} must be an integer in [${min}, ${max}], got ${req[key]}`);
  return v;
}

function tokenIds(req, key, vocabSize) {
  const ids = req[key];
  if (!Array.isArray(ids) || ids.length === 0)
    throw new RequestError(`${key} must be a non-empty list of token ids`);
  ids.forEach((id, i) => {
    if (!Number.isInteger(id) || id < 0 || id >= vocabSize)
      throw new RequestError(`${key}[${i}] = ${JSON.stringify(id)} is not a token id of this model (vocabulary ${vocabSize})`);
  });
  return ids;
}

// start starts llama.cpp on the CPU only, with the prebuilt binaries only
// (never a download or a build), and says what it started: every reply
// carries this info.
async function start(threads) {
  const started = performance.now();
  let cpuBackend = null;
  const llama = await getLlama({
    gpu: false, build: "never", skipDownload: true, progressLogs: false, maxThreads: threads,
    // "log" is the level of ggml's "load_backend: loaded CPU backend from
    // PATH", the one place that names the CPU library ggml picked.
    logLevel: "log",
    logger(level, message) {
      const loaded = /loaded CPU backend from (\S+)/.exec(message);
      if (loaded) cpuBackend = basename(loaded[1]);
      if (["fatal", "error", "warn"].includes(level)) process.stderr.write(`llama.cpp ${level}: ${message}\n`);
    },
  });
  // ggml logs from its own thread; the line reaches the logger a few
  // event-loop turns after getLlama resolves (a build without the line
  // leaves cpu_backend null after this bounded wait).
  for (const until = performance.now() + 1000; cpuBackend == null && performance.now() < until;)
    await new Promise((resolve) => setTimeout(resolve, 1));
  if (llama.gpu !== false) throw new Error(`llama.cpp started with GPU ${llama.gpu}, not on the CPU only`);
  const info = {
    node_llama_cpp: nodeLlamaCppVersion,
    llama_cpp: `${llama.llamaCppRelease.repo}@${llama.llamaCppRelease.release}`,
    build: llama.buildType,
    gpu: "none",
    cpu_backend: cpuBackend,
    system_info: llama.systemInfo.trim(),
  };
  return {llama, info, started};
}

// load loads the request's model: its vocabulary only, or the weights and
// one context sequence with the request's threads, size and KV type.
async function load(req, {vocabOnly = false} = {}) {
  if (typeof req.model !== "string") throw new RequestError("model must be the path of a GGUF file");
  if (!existsSync(req.model)) throw new RequestError(`model ${req.model}: no such file`);
  const threads = vocabOnly ? 1 : integer(req, "threads", 1, 1024);
  const {llama, info, started} = await start(threads);
  const model = await llama.loadModel({modelPath: req.model, gpuLayers: 0, vocabOnly});
  const vocabSize = model.fileInfo.metadata.tokenizer?.ggml?.tokens?.length ?? Infinity;
  const seconds = () => (performance.now() - started) / 1000;
  if (vocabOnly) return {info: {...info, load_seconds: seconds()}, model, vocabSize};

  const kvType = req.kv_type ?? "f16";
  if (!["f16", "f32"].includes(kvType)) throw new RequestError(`kv_type must be "f16" or "f32", got ${JSON.stringify(kvType)}`);
  const contextSize = integer(req, "context_size", 1, 1 << 20, model.trainContextSize);
  const context = await model.createContext({
    // min: node-llama-cpp may otherwise hand a context fewer threads than
    // asked; with maxThreads = threads, this one context gets exactly them.
    contextSize, batchSize: contextSize, threads: {ideal: threads, min: threads},
    // "auto" would not say what it chose; the default is the plain path.
    flashAttention: req.flash_attention === true,
    experimentalKvCacheKeyType: kvType.toUpperCase(), experimentalKvCacheValueType: kvType.toUpperCase(),
    failedCreationRemedy: false,
  });
  // Context shifting would drop the sequence's first tokens and go on as if
  // nothing happened; a reference must stop instead.
  const sequence = context.getSequence({contextShift: {strategy() {
    throw new Error(`the context of ${context.contextSize} tokens is full`);
  }}});
  llama.logLevel = "warn"; // the backend is known; no logging on the hot path
  Object.assign(info, {
    threads: context.currentThreads, context_size: context.contextSize, batch_size: context.batchSize,
    flash_attention: context.flashAttention, kv_type: kvType, load_seconds: seconds(),
  });
  return {info, vocabSize, context, sequence};
}

// topK turns a probability map into the k most likely tokens, ordered by
// probability then id (llama.cpp's sort does not order ties), each with
// its log-probability. Tokens whose float32 probability is 0 have no
// finite score and are left out, so a list can be shorter than k.
function topK(probabilities, k) {
  return [...probabilities].filter(([, p]) => p > 0)
    .sort(([ida, pa], [idb, pb]) => pb - pa || ida - idb)
    .slice(0, k).map(([id, p]) => ({id, value: Math.log(p)}));
}

async function info() {
  return {info: (await start(1)).info};
}

async function tokenize(req) {
  const {info, model} = await load(req, {vocabOnly: true});
  if (typeof req.text !== "string") throw new RequestError("text must be a string");
  const special = req.special === true;
  // node-llama-cpp tokenizes with add_special off; BOS and EOS are added
  // here as llama.cpp's llama_tokenize(add_special = true) adds them, from
  // the GGUF's add_bos_token and add_eos_token. The space prefix is the
  // tokenizer's own (add_space_prefix). With special, control-token text
  // such as "<s>" becomes that token, as parse_special does.
  const {bos, eos, shouldPrependBosToken, shouldAppendEosToken} = model.tokens;
  const tokens = [
    ...(shouldPrependBosToken && bos != null ? [bos] : []),
    ...model.tokenize(req.text, special),
    ...(shouldAppendEosToken && eos != null ? [eos] : []),
  ];
  return {info, tokens, options: {add_special: true, parse_special: special}};
}

// vocab is for decoding ids in tests: the pieces as the GGUF stores them.
async function vocab(req) {
  const {info, model} = await load(req, {vocabOnly: true});
  const t = model.fileInfo.metadata.tokenizer?.ggml ?? {};
  return {info, pieces: t.tokens ?? [], scores: t.scores ?? [], types: t.token_type ?? []};
}

async function greedy(req) {
  const {info, vocabSize, context, sequence} = await load(req);
  const prompt = tokenIds(req, "prompt", vocabSize);
  const n = integer(req, "n", 1, 1 << 20);
  const k = integer(req, "top_k", 1, vocabSize, 8);
  // The last generated token is never evaluated, and node-llama-cpp keeps
  // one cell of the context free: prompt + n - 1 <= contextSize - 1.
  const room = context.contextSize - prompt.length;
  if (room < 1) throw new RequestError(`the prompt of ${prompt.length} tokens leaves no room in a context of ${context.contextSize}`);
  const want = Math.min(n, room);
  const tokens = [], top = [];
  const started = performance.now();
  // temperature 0 selects llama.cpp's greedy sampler alone (no top-k/p,
  // penalties or bias); yieldEogToken keeps it going past EOS.
  for await (const out of sequence.evaluateWithMetadata(prompt, {probabilities: true}, {temperature: 0, yieldEogToken: true})) {
    tokens.push(out.token);
    top.push(topK(out.probabilities, k));
    if (tokens.length === want) break;
  }
  const seconds = (performance.now() - started) / 1000;
  return {info, kind: "logprobs", tokens, top, context_full: want < n, seconds};
}

async function forced(req) {
  const {info, vocabSize, context, sequence} = await load(req);
  const tokens = tokenIds(req, "tokens", vocabSize);
  const k = integer(req, "top_k", 1, vocabSize, 8);
  const most = Math.min(context.contextSize - 1, context.batchSize);
  if (tokens.length > most)
    throw new RequestError(`${tokens.length} tokens do not fit one batch of a context of ${context.contextSize} (at most ${most}; context_size sets both)`);
  const started = performance.now();
  // One controlledEvaluate of the whole sequence: one llama_decode of one
  // batch (batch size = context size) with an output at every position.
  // The default sampler options there are temperature 0: greedy.
  const out = await sequence.controlledEvaluate(tokens.map((t) => [t, {generateNext: {probabilities: true}}]));
  const seconds = (performance.now() - started) / 1000;
  const top = tokens.map((_, i) => {
    if (out[i]?.next.probabilities === undefined) throw new Error(`no probabilities came back for position ${i}`);
    return topK(out[i].next.probabilities, k);
  });
  return {info, kind: "logprobs", top, seconds};
}

async function bench(req) {
  const {info, vocabSize, context, sequence} = await load(req);
  const prompt = tokenIds(req, "prompt", vocabSize);
  const n = integer(req, "n", 1, 1 << 20);
  const runs = integer(req, "runs", 1, 1000, 3);
  // Each run evaluates prompt + n tokens: the prompt, the first generated
  // token (untimed), then n timed one-token decodes.
  if (prompt.length + n > context.contextSize - 1)
    throw new RequestError(`prompt ${prompt.length} + n ${n} tokens do not fit a context of ${context.contextSize} (at most ${context.contextSize - 1})`);
  const results = [];
  for (let r = 0; r < runs; r++) {
    await sequence.clearHistory();
    const started = performance.now();
    let first = 0, count = -1;
    for await (const _ of sequence.evaluate(prompt, {temperature: 0, yieldEogToken: true})) {
      if (++count === 0) first = performance.now();
      else if (count === n) break;
    }
    const end = performance.now();
    results.push({prompt_seconds: (first - started) / 1000, seconds: (end - first) / 1000, tokens: count});
  }
  return {info, runs: results};
}
