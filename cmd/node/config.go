package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/cluster"
	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/gpu"
	"github.com/kvwarden/kvwarden/httpapi"
	"github.com/kvwarden/kvwarden/internal/boundedread"
	"github.com/kvwarden/kvwarden/kv"
)

// configFileBytesMax bounds the configuration file read at startup (1 MiB):
// it holds a few dozen numbers, and an unbounded read of the wrong path
// (a device, a log) must not exhaust memory.
const configFileBytesMax = 1 << 20

// nodeConfig is the node's configuration, read from a JSON file
// (--config) and overridden by flags given on the command line. Each JSON
// key is its flag's name with '_' for '-'. Subcommands that need more
// settings add fields here, so one file configures the whole node.
type nodeConfig struct {
	// Devices is the device source: auto, nvml, cpu or mock:dgxa100 (and
	// the other mocks gpu.DeviceSources lists).
	Devices string `json:"devices"`
	// CPUMemoryBytes is the CPU device's memory budget in bytes; 0 means
	// none, so only an explicit KVPoolTokens can size a CPU pool.
	CPUMemoryBytes int64 `json:"cpu_memory_bytes"`
	// ContextTokens is the context window the node advertises, in tokens;
	// 0 is refused.
	ContextTokens int64 `json:"context_tokens"`
	// KVPoolTokens is an explicit pool size in tokens per device; 0 means
	// derive it from device memory.
	KVPoolTokens int64 `json:"kv_pool_tokens"`
	// MemoryFraction is the share of device memory for weights, reserve
	// and pool, in (0, 1].
	MemoryFraction float64 `json:"memory_fraction"`
	// WeightBytes and ReserveBytes are bytes per device for model weights
	// and for everything else kept back; 0 means none.
	WeightBytes  int64 `json:"weight_bytes"`
	ReserveBytes int64 `json:"reserve_bytes"`
	// Model and Tokenizer are the paths of the model to serve: a GGUF
	// file alone (it carries its tokenizer), a llama2.c checkpoint and
	// its tokenizer, or neither for the built-in model
	// (engine.DefaultModelConfig: weights from a seed, the byte
	// tokenizer). With a model, preflight takes the KV geometry (layers,
	// KV heads, head dim) and the weight bytes from it, and refuses
	// --layers, --kv-heads, --head-dim and --weight-bytes.
	Model     string `json:"model"`
	Tokenizer string `json:"tokenizer"`
	// Layers, KVHeads, HeadDim, PageTokens and DType are the KV geometry
	// (kv.Geometry); DType is f32, f16 or bf16, and is also the KV type of
	// the model "node run" serves.
	Layers     int    `json:"layers"`
	KVHeads    int    `json:"kv_heads"`
	HeadDim    int    `json:"head_dim"`
	PageTokens int    `json:"page_tokens"`
	DType      string `json:"dtype"`

	// The fields below configure the node "node run" serves; preflight
	// ignores them. ContextTokens, PageTokens, DType, Model and Tokenizer
	// are shared: run advertises ContextTokens, pages every pool by
	// PageTokens and serves Model (or the built-in one) with DType KV.
	// The other sizing fields do not apply to run, whose pools take the
	// geometry of the model it serves.

	// Role is what the node serves: "all" (its own prefill and decode
	// workers and admission), or one cluster role: "prefill", "decode" or
	// "router" (admits and routes requests, holds no pages).
	Role string `json:"role"`
	// Listen is the host:port the node serves protoactor remote on (what
	// clients and other nodes send to); port 0 picks a free one. Empty
	// means the role's default (listenFor): defaultEndpoint for the roles
	// clients send to, a free port for the others, so that the nodes of a
	// cluster started by hand on one machine never ask for the same port.
	Listen string `json:"listen"`
	// Gossip is the IP:port the node gossips membership on, UDP and TCP;
	// port 0 picks a free one. On a loopback address the node uses fast
	// local timers (membership.DefaultLocalConfig), elsewhere LAN timers
	// (membership.DefaultConfig).
	Gossip string `json:"gossip"`
	// Data is the host:port of the KV data plane, on which a node that
	// decodes receives KV pages from prefill nodes; port 0 picks a free
	// one. Other roles ignore it.
	Data string `json:"data"`
	// Join are gossip addresses (host:port) of members of the cluster to
	// join; empty starts a new cluster of one.
	Join addrList `json:"join"`
	// Advertise and DataAdvertise are where peers reach the node's remote
	// and data plane when not at Listen and Data: a proxy in front of the
	// node forwards them there. Empty means Listen's and Data's.
	Advertise     string `json:"advertise"`
	DataAdvertise string `json:"data_advertise"`
	// HTTP is the host:port the node serves its probes (/healthz,
	// /readyz) and Prometheus metrics (/metrics) on; empty serves none.
	HTTP string `json:"http"`
	// APIKeys is the API keys file (httpapi.KeysFile) of the
	// OpenAI-compatible API a router or a node of role all serves on HTTP;
	// empty serves no API. Read again on SIGHUP.
	APIKeys string `json:"api_keys"`
	// Tenants is the tenants' shares file (tenancy.Policy) that a router,
	// and a node clients send to directly, hold tenants' requests to and
	// decode workers step by; empty gives every tenant
	// tenancy.DefaultShare. Read again on SIGHUP.
	Tenants string `json:"tenants"`
	// HTTPTLSCert and HTTPTLSKey, both or neither, are the PEM certificate
	// (chain) and key the node serves HTTPS with on HTTP; neither serves
	// plain HTTP.
	HTTPTLSCert string `json:"http_tls_cert"`
	HTTPTLSKey  string `json:"http_tls_key"`
	// HTTPConnsMax and HTTPConnsPerAddrMax bound the HTTP connections held
	// at once, in all and of one client address; HTTPDescriptorsReserved
	// is the file descriptors left to the node's own traffic, checked with
	// HTTPConnsMax against the process's limit of open files at start-up.
	// HTTPReadTimeout bounds reading a request, HTTPIdleTimeout a
	// kept-alive connection's wait. HTTPAuthFailuresMax failed
	// authentications from one address in HTTPAuthFailureWindow have its
	// next ones answered 429 for HTTPAuthPenalty; HTTPAuthAddrsMax bounds
	// the addresses remembered. See httpapi.Limits.
	HTTPConnsMax            int      `json:"http_conns_max"`
	HTTPConnsPerAddrMax     int      `json:"http_conns_per_addr_max"`
	HTTPDescriptorsReserved int      `json:"http_descriptors_reserved"`
	HTTPReadTimeout         duration `json:"http_read_timeout"`
	HTTPIdleTimeout         duration `json:"http_idle_timeout"`
	HTTPAuthFailuresMax     int      `json:"http_auth_failures_max"`
	HTTPAuthFailureWindow   duration `json:"http_auth_failure_window"`
	HTTPAuthPenalty         duration `json:"http_auth_penalty"`
	HTTPAuthAddrsMax        int      `json:"http_auth_addrs_max"`
	// Faults is the fault spec a chaos build of the node injects
	// (faults.Parse); empty injects none, and a production build refuses
	// any other.
	Faults string `json:"faults"`
	// PrefillWorkers and DecodeWorkers are the GPU workers of each role, at
	// least 1 each; PrefillPages and DecodePages the pages of each worker's
	// pool.
	PrefillWorkers int `json:"prefill_workers"`
	DecodeWorkers  int `json:"decode_workers"`
	PrefillPages   int `json:"prefill_pages"`
	DecodePages    int `json:"decode_pages"`
	// PrefixCachePercent is the most of each prefill worker's pool its
	// prefix cache keeps, in percent (0: no prefix cache).
	PrefixCachePercent int `json:"prefix_cache_percent"`
	// DecodeCachePercent is the most of each decode worker's pool its
	// prefix cache keeps, in percent (0: none).
	DecodeCachePercent int `json:"decode_cache_percent"`
	// PrefixRouting sends a prompt where its prefix is cached, load
	// allowing (a router's choice of prefill node, a node's of worker).
	PrefixRouting bool `json:"prefix_routing"`
	// CacheSummaryEvery is how often a router asks each prefilling node
	// what its prefix caches hold.
	CacheSummaryEvery duration `json:"cache_summary_every"`
	// MaxTokensMax is the most tokens one request may ask to generate.
	MaxTokensMax int `json:"max_tokens_max"`
	// MemoryBudgetBytes bounds the bytes of every KV pool the node holds
	// together (workers × pages × page bytes), checked before any is
	// allocated; 0 means the host's physical memory.
	MemoryBudgetBytes int64 `json:"memory_budget_bytes"`
	// Procs is how many processors (GOMAXPROCS) the node's Go runtime
	// runs on, 0 to procsMax; 0 means the role's default (procsFor).
	Procs int `json:"procs"`
	// QueueMax is the most requests in flight at once; one more is "busy".
	QueueMax int `json:"queue_max"`
	// BatchMax is the most decode sequences a worker steps at once.
	BatchMax int `json:"batch_max"`
	// RequestTimeout bounds a request from admission to its last token;
	// ReclaimAfter is how long a released page waits for its lease holders
	// before it is reclaimed anyway. JSON spells them as Go does: "30s".
	RequestTimeout duration `json:"request_timeout"`
	ReclaimAfter   duration `json:"reclaim_after"`
	// PrefillTimeout bounds one KV transfer attempt from a prefill worker
	// or node; past it the peer is taken for lost and the transfer retried
	// elsewhere. DrainTimeout bounds a drain: past it the node leaves with
	// requests still in flight.
	PrefillTimeout duration `json:"prefill_timeout"`
	DrainTimeout   duration `json:"drain_timeout"`
	// MovesMax is the most of a decode node's requests it moves to other
	// decode nodes at once (node drain, node migrate).
	MovesMax int `json:"moves_max"`
	// LostAfter is how long a member that failure detection declared dead
	// keeps its requests while its address does not refuse connections (a
	// stopped or paused process, an unreachable host); past it they fail
	// as node_lost. A crashed member's are failed at once. It must be
	// below RequestTimeout; 0 means cluster.DefaultLostAfter, or half of
	// RequestTimeout if that is less.
	LostAfter duration `json:"lost_after"`
	// OwnedPageTimeout bounds how long a page stays owned (reserved,
	// filling, sealed or leased) before it is reclaimed, so that an owner
	// that died cannot pin it; it must exceed RequestTimeout and
	// PrefillTimeout.
	OwnedPageTimeout duration `json:"owned_page_timeout"`
}

// addrList is a list of host:port addresses, given as one comma-separated
// flag value or a JSON array. Set replaces the list (pflag's string slices
// append when set twice, which would double a list re-applied over a
// configuration file).
type addrList []string

func (l *addrList) String() string { return strings.Join(*l, ",") }
func (l *addrList) Type() string   { return "host:port[,host:port]" }

func (l *addrList) Set(s string) error {
	*l = nil
	for a := range strings.SplitSeq(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			*l = append(*l, a)
		}
	}
	return nil
}

// duration is a time.Duration that JSON spells as Go does ("30s", "2m"),
// not as a count of nanoseconds nobody can read.
type duration time.Duration

func (d *duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration %s: want a string such as \"30s\"", b)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = duration(v)
	return nil
}

func defaultNodeConfig() nodeConfig {
	s := gpu.DefaultSizingConfig()
	a := actors.DefaultConfig()
	h := httpapi.DefaultLimits()
	return nodeConfig{
		HTTPConnsMax:            h.ConnsMax,
		HTTPConnsPerAddrMax:     h.ConnsPerAddrMax,
		HTTPDescriptorsReserved: h.DescriptorsReserved,
		HTTPReadTimeout:         duration(h.ReadTimeout),
		HTTPIdleTimeout:         duration(h.IdleTimeout),
		HTTPAuthFailuresMax:     h.AuthFailuresMax,
		HTTPAuthFailureWindow:   duration(h.AuthFailureWindow),
		HTTPAuthPenalty:         duration(h.AuthPenalty),
		HTTPAuthAddrsMax:        h.AuthAddrsMax,
		Role:                    roleAll,
		PrefillWorkers:          a.PrefillWorkers,
		DecodeWorkers:           a.DecodeWorkers,
		PrefillPages:            a.PrefillPages,
		DecodePages:             a.DecodePages,
		PrefixCachePercent:      a.PrefixCachePercent,
		DecodeCachePercent:      a.DecodeCachePercent,
		PrefixRouting:           a.PrefixRouting,
		CacheSummaryEvery:       duration(a.CacheSummaryEvery),
		MaxTokensMax:            a.MaxTokensMax,
		QueueMax:                a.QueueMax,
		BatchMax:                a.BatchMax,
		RequestTimeout:          duration(a.RequestTimeout),
		ReclaimAfter:            duration(a.ReclaimAfter),
		PrefillTimeout:          duration(a.PrefillTimeout),
		OwnedPageTimeout:        duration(a.OwnedPageTimeout),
		DrainTimeout:            duration(cluster.DefaultLocalNodeConfig(actors.RoleAll).DrainTimeout),
		MovesMax:                cluster.DefaultLocalNodeConfig(actors.RoleAll).MovesMax,
		Gossip:                  "127.0.0.1:0",
		Data:                    "127.0.0.1:0",
		Devices:                 string(gpu.SourceAuto),
		MemoryFraction:          s.MemoryFraction,
		WeightBytes:             s.WeightBytes,
		ReserveBytes:            s.ReserveBytes,
		Layers:                  s.Geometry.Layers,
		KVHeads:                 s.Geometry.KVHeads,
		HeadDim:                 s.Geometry.HeadDim,
		PageTokens:              s.Geometry.PageTokens,
		DType:                   s.Geometry.DType.String(),
	}
}

// bindFlags registers one flag per field, defaulting to c's values.
func (c *nodeConfig) bindFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Devices, "devices", c.Devices, "device source: auto (NVML if Init succeeds, else cpu), nvml, cpu, mock:dgxa100, mock:dgxh100, mock:dgxh200, mock:dgxb200")
	fs.Int64Var(&c.CPUMemoryBytes, "cpu-memory-bytes", c.CPUMemoryBytes, "memory budget of the CPU device in bytes (0: none; then only --kv-pool-tokens sizes a CPU pool)")
	fs.Int64Var(&c.ContextTokens, "context-tokens", c.ContextTokens, "context window the node advertises, in tokens (required)")
	fs.Int64Var(&c.KVPoolTokens, "kv-pool-tokens", c.KVPoolTokens, "explicit KV pool size per device in tokens, as measured; skips memory sizing (0: size from memory)")
	fs.Float64Var(&c.MemoryFraction, "memory-fraction", c.MemoryFraction, "share of device memory for weights, reserve and KV pool, in (0, 1]")
	fs.Int64Var(&c.WeightBytes, "weight-bytes", c.WeightBytes, "model weight bytes resident on each device")
	fs.Int64Var(&c.ReserveBytes, "reserve-bytes", c.ReserveBytes, "bytes per device kept back for activations, runtime and fragmentation")
	fs.IntVar(&c.Layers, "layers", c.Layers, "transformer layers")
	fs.IntVar(&c.KVHeads, "kv-heads", c.KVHeads, "key/value heads per layer")
	fs.IntVar(&c.HeadDim, "head-dim", c.HeadDim, "elements per head")
	fs.IntVar(&c.PageTokens, "page-tokens", c.PageTokens, "tokens per KV page")
	fs.StringVar(&c.DType, "dtype", c.DType, "KV element type: f32, f16 or bf16")
	c.bindModelFlags(fs)
}

// bindModelFlags registers --model and --tokenizer.
func (c *nodeConfig) bindModelFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Model, "model", c.Model, modelFlagHelp)
	fs.StringVar(&c.Tokenizer, "tokenizer", c.Tokenizer, tokenizerFlagHelp)
}

// The help of --model and --tokenizer, which every command that loads a
// model shares.
const (
	modelFlagHelp     = "model to serve: a GGUF file (F32, F16, BF16, Q8_0 or Q4_0 weights; its tokenizer inside), or a llama2.c checkpoint with --tokenizer; empty: the built-in model"
	tokenizerFlagHelp = "llama2.c tokenizer of a llama2.c --model (tokenizer.bin format); none with a GGUF file"
)

// ggufContextTokensDefault caps the context window of a GGUF model when
// --context-tokens does not ask for another, in tokens: files declare the
// window they were trained for (128 Ki tokens for Llama 3.1), and each
// token of the window a sequence fills costs KV.
const ggufContextTokensDefault = 8192

// model loads the model c names, with K and V of type DType in KV pages:
// the GGUF file at Model, the checkpoint and tokenizer at Model and
// Tokenizer, or the built-in model. A GGUF model's window is its file's,
// at most ContextTokens when that is set to other than run's default, else
// at most ggufContextTokensDefault.
func (c nodeConfig) model() (*engine.Model, error) {
	dtype, err := kv.ParseDType(c.DType)
	if err != nil {
		return nil, usageError{fmt.Errorf("--dtype: %w", err)}
	}
	if c.Model == "" && c.Tokenizer == "" {
		cfg := engine.DefaultModelConfig()
		cfg.KVDType = dtype
		return engine.BuiltinModel(cfg)
	}
	// A file that cannot be read is no GGUF file here: the loader says
	// why it cannot be read, after the usage is checked.
	gguf, _ := engine.IsGGUF(c.Model)
	switch {
	case gguf && c.Tokenizer != "":
		return nil, usageError{fmt.Errorf("--model %q is a GGUF file, which carries its tokenizer: give no --tokenizer (%q)", c.Model, c.Tokenizer)}
	case gguf:
		window := ggufContextTokensDefault
		if c.ContextTokens > 0 && c.ContextTokens != int64(actors.DefaultConfig().ContextTokens) {
			window = int(min(c.ContextTokens, math.MaxInt32))
		}
		return engine.LoadGGUF(c.Model, engine.GGUFOptions{KVDType: dtype, ContextTokens: window})
	case c.Model == "" || c.Tokenizer == "":
		return nil, usageError{fmt.Errorf("--model %q and --tokenizer %q: give a GGUF file alone, a llama2.c checkpoint and its tokenizer, or neither",
			c.Model, c.Tokenizer)}
	}
	return engine.LoadModel(c.Model, c.Tokenizer, dtype)
}

// load reads the JSON file at path (if any) into c and then re-applies the
// flags given on the command line, so that flags override the file and the
// file overrides the defaults.
func (c *nodeConfig) load(fs *pflag.FlagSet, path string) error {
	if path == "" {
		return nil
	}
	given := map[string]string{}
	fs.Visit(func(f *pflag.Flag) { given[f.Name] = f.Value.String() })
	data, err := c.readFile(path)
	if err != nil {
		return err
	}
	if err := usedFields(fs, path, data); err != nil {
		return err
	}
	for name, value := range given {
		if err := fs.Set(name, value); err != nil {
			return fmt.Errorf("re-applying --%s=%s over %s: %w", name, value, path, err)
		}
	}
	return nil
}

// usedFields refuses a field of the config file at path (already read
// and checked by readFile) that the command does not use: one is used
// when the command has its flag (field context_tokens, flag
// --context-tokens). A field the command ignored would be a setting the
// operator believes in and the node does not have.
func usedFields(fs *pflag.FlagSet, path string, data []byte) error {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	var unused []string
	for name := range fields {
		if fs.Lookup(strings.ReplaceAll(name, "_", "-")) == nil {
			unused = append(unused, name)
		}
	}
	if len(unused) > 0 {
		slices.Sort(unused)
		return fmt.Errorf("config %s: %s: not used by this command, which has no flag of that name", path,
			strings.Join(unused, ", "))
	}
	return nil
}

// readFile decodes the config file at path into c and returns what it
// read.
func (c *nodeConfig) readFile(path string) ([]byte, error) {
	data, err := boundedread.File(path, configFileBytesMax)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	// A misspelt key would otherwise be ignored and its default used,
	// which is how a node ends up advertising what it cannot hold.
	dec.DisallowUnknownFields()
	if err := dec.Decode(c); err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("config %s: trailing data after the JSON object", path)
	}
	return data, nil
}

// build validates c and turns it into the gpu package's configurations.
// With a model, the KV geometry and the weight bytes are the model's (the
// geometry its pools get in "node run"), else the flags'.
func (c nodeConfig) build(m *engine.Model) (gpu.DiscoveryConfig, gpu.PreflightConfig, error) {
	d := gpu.DiscoveryConfig{Source: gpu.DeviceSource(c.Devices), CPUMemoryBytes: c.CPUMemoryBytes,
		DevicesMax: gpu.DefaultDevicesMax}
	if err := d.Validate(); err != nil {
		return d, gpu.PreflightConfig{}, err
	}
	dtype, err := kv.ParseDType(c.DType)
	if err != nil {
		return d, gpu.PreflightConfig{}, err
	}
	p := gpu.PreflightConfig{
		ContextTokens: c.ContextTokens,
		Sizing: gpu.SizingConfig{
			Geometry: kv.Geometry{Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim,
				PageTokens: c.PageTokens, DType: dtype},
			MemoryFraction: c.MemoryFraction,
			WeightBytes:    c.WeightBytes,
			ReserveBytes:   c.ReserveBytes,
			KVPoolTokens:   c.KVPoolTokens,
		},
	}
	if m != nil {
		p.Sizing.Geometry = m.Config().Geometry(c.PageTokens)
		p.Sizing.WeightBytes = m.WeightBytes()
	}
	return d, p, p.Validate()
}

// configFlag registers --config on cmd and returns where its value lands.
func configFlag(cmd *cobra.Command) *string {
	return cmd.Flags().String("config", "", "JSON configuration file of this command's settings, each named as its flag (context_tokens for --context-tokens); flags given on the command line override it")
}
