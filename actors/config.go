package actors

import (
	"fmt"
	"time"

	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/tenancy"
)

// Role is what a node does in a cluster.
type Role string

const (
	// RoleAll runs admission, prefill and decode in one node.
	RoleAll Role = "all"
	// RolePrefill computes prompts' KV and streams it to decode nodes.
	RolePrefill Role = "prefill"
	// RoleDecode admits requests (from clients or a router), plans their
	// transfer from a prefill node and generates.
	RoleDecode Role = "decode"
	// RoleRouter admits client requests and routes them to a decode and a
	// prefill node; it holds no pages.
	RoleRouter Role = "router"
)

// ParseRole reads a role name.
func ParseRole(s string) (Role, error) {
	switch r := Role(s); r {
	case RoleAll, RolePrefill, RoleDecode, RoleRouter:
		return r, nil
	}
	return "", fmt.Errorf("actors: unknown role %q (want all, prefill, decode or router)", s)
}

// Prefills and Decodes say whether the role runs workers of each kind.
func (r Role) Prefills() bool { return r == RoleAll || r == RolePrefill }
func (r Role) Decodes() bool  { return r == RoleAll || r == RoleDecode }

// Config is everything one node's actors need. Every limit is a named field
// with its unit; Validate runs before any pool is allocated.
type Config struct {
	// Role is what the node does; the worker counts and pool sizes of a
	// kind it does not run are ignored.
	Role Role
	// Model is the model every worker computes.
	Model engine.ModelConfig
	// PageTokens is the tokens one KV page holds.
	PageTokens int
	// PrefillWorkers and DecodeWorkers are how many GPU-worker actors of
	// each role the node runs, each with its own pool. At least 1 each.
	PrefillWorkers, DecodeWorkers int
	// PrefillPages and DecodePages are the pages of each worker's pool.
	PrefillPages, DecodePages int
	// ContextTokens is the context window the node advertises: prompt plus
	// generated tokens. At most Model.ContextTokens.
	ContextTokens int
	// MaxTokensMax is the most tokens one request may ask to generate.
	MaxTokensMax int
	// QueueMax is the most requests admitted and not finished at once;
	// one more is answered "busy".
	QueueMax int
	// BatchMax is the most decode sequences a worker steps between two
	// looks at its mailbox.
	BatchMax int
	// TransferBatchPagesMax and TransferBatchBytesMax bound one batch of
	// KV frames from prefill to decode, in pages and bytes.
	TransferBatchPagesMax int
	TransferBatchBytesMax int
	// MailboxMax bounds every actor's mailbox, in messages; a sender to a
	// full mailbox waits.
	MailboxMax int
	// CallTimeout bounds one request from an actor to another and its
	// answer.
	CallTimeout time.Duration
	// RequestTimeout bounds a whole request from admission to its last
	// token; past it the request fails and its pages are released.
	RequestTimeout time.Duration
	// PrefillTimeout bounds one transfer attempt, from the plan to the
	// prefill peer's TransferDone, queueing there included; past it the
	// peer is taken for lost. Membership reports a dead peer sooner; this
	// is the backstop for a plan or an answer lost on the way.
	PrefillTimeout time.Duration
	// ReserveWait is how long a request waits for pages when a pool is
	// exhausted before it fails with "busy"; ReserveRetry is the pause
	// between attempts.
	ReserveWait, ReserveRetry time.Duration
	// ReclaimAfter is how long a released page waits for a lease holder
	// or the peer's acknowledgement before it is reclaimed anyway.
	ReclaimAfter time.Duration
	// ArenaBytesMax bounds each pool's arena, in bytes.
	ArenaBytesMax int64
	// Incarnation identifies this run of the node in every tag; zero
	// means draw one at start.
	Incarnation uint64
	// OwnedPageTimeout is the longest a page may stay owned (reserved,
	// filling, sealed or leased) before its page actor reclaims it anyway,
	// so that an owner that died without releasing cannot pin it. It must
	// exceed RequestTimeout and PrefillTimeout, which bound every owner's
	// own use of a page.
	OwnedPageTimeout time.Duration
	// TransferSendsMax is how many transfers one prefill worker sends to
	// other nodes' data planes at once, each from its own goroutine, so
	// that a slow peer holds up only its own; a plan beyond waits in the
	// worker's queue.
	TransferSendsMax int
	// DonePlansMax is how many acknowledged or aborted plans a prefill
	// worker and its dispatcher remember (each for PrefillTimeout), so
	// that a duplicate arriving after its plan ended is dropped instead of
	// prefilled again.
	DonePlansMax int
	// Tenants are the tenants' shares that admission holds clients'
	// requests to and decode workers step by, and the prefix cache
	// scopes prefill workers key their caches by; nil is
	// tenancy.DefaultPolicy.
	Tenants *tenancy.Shares
	// PrefixCachePercent is the most of each prefill worker's pool, in
	// percent, that its prefix cache keeps of prompts' full pages once
	// their transfers are acknowledged, 0 (no cache) to 100; a prefill
	// that finds its pool full gives cached pages up first.
	PrefixCachePercent int
	// DecodeCachePercent is the most of each decode worker's pool, in
	// percent, that its prefix cache keeps of answered prompts' full
	// pages, 0 (no cache) to 100: a request whose prompt starts with
	// pages it holds copies them and asks prefill for the rest only; one
	// that finds the pool full gives cached pages up first.
	DecodeCachePercent int
	// PrefixRouting has routers send a prompt to the prefill and decode
	// nodes, and a node with several prefill workers to the worker, that
	// its prefix was sent to before (handoff.PrefixAffinity), load
	// allowing; false picks by load alone.
	PrefixRouting bool
	// CacheSummaryEvery is how often a router with PrefixRouting asks
	// each prefilling or decoding node what its prefix caches hold
	// (messages.CacheSummaryRequest). Must be positive.
	CacheSummaryEvery time.Duration
}

// DefaultConfig is a node of one prefill and one decode worker over the
// reference engine's default model, with 16-token pages.
func DefaultConfig() Config {
	return Config{
		Role:                  RoleAll,
		Model:                 engine.DefaultModelConfig(),
		PageTokens:            16,
		PrefillWorkers:        1,
		DecodeWorkers:         1,
		PrefillPages:          512,
		DecodePages:           1024,
		ContextTokens:         2048,
		MaxTokensMax:          1024,
		QueueMax:              256,
		BatchMax:              32,
		TransferBatchPagesMax: 8,
		TransferBatchBytesMax: 1 << 20,
		MailboxMax:            1024,
		CallTimeout:           5 * time.Second,
		RequestTimeout:        2 * time.Minute,
		PrefillTimeout:        60 * time.Second,
		ReserveWait:           10 * time.Second,
		ReserveRetry:          20 * time.Millisecond,
		ReclaimAfter:          30 * time.Second,
		ArenaBytesMax:         kv.DefaultArenaBytesMax,
		OwnedPageTimeout:      5 * time.Minute,
		TransferSendsMax:      8,
		DonePlansMax:          4096,
		PrefixCachePercent:    50,
		DecodeCachePercent:    50,
		PrefixRouting:         true,
		CacheSummaryEvery:     2 * time.Second,
	}
}

// DefaultLocalConfig is DefaultConfig with small pools and short timers,
// for tests and a first look.
func DefaultLocalConfig() Config {
	c := DefaultConfig()
	c.PrefillPages = 128
	c.DecodePages = 256
	c.ContextTokens = 1024
	c.MaxTokensMax = 256
	c.QueueMax = 64
	c.RequestTimeout = 30 * time.Second
	c.PrefillTimeout = 20 * time.Second
	c.ReserveWait = 2 * time.Second
	c.ReclaimAfter = 2 * time.Second
	c.OwnedPageTimeout = time.Minute
	return c
}

// Geometry is the KV geometry of every pool of the node.
func (c Config) Geometry() kv.Geometry { return c.Model.Geometry(c.PageTokens) }

// BatchLimits are the bounds of one transfer batch.
func (c Config) BatchLimits() kv.BatchLimits {
	return kv.BatchLimits{PagesMax: c.TransferBatchPagesMax, BytesMax: c.TransferBatchBytesMax, Frame: c.Geometry().Limits()}
}

func (c Config) pool(pages int, incarnation uint64) kv.Config {
	return kv.Config{Geometry: c.Geometry(), Pages: pages, Incarnation: incarnation,
		ReclaimAfter: c.ReclaimAfter, OwnedTimeout: c.OwnedPageTimeout, ArenaBytesMax: c.ArenaBytesMax}
}

type intField struct {
	name string
	v    int
}

// Validate reports the first field out of range, with its value.
func (c Config) Validate() error {
	if err := c.Model.Validate(); err != nil {
		return err
	}
	if err := c.Geometry().Validate(); err != nil {
		return err
	}
	if _, err := ParseRole(string(c.Role)); err != nil {
		return err
	}
	ints := []intField{
		{"ContextTokens", c.ContextTokens}, {"MaxTokensMax", c.MaxTokensMax},
		{"QueueMax", c.QueueMax}, {"BatchMax", c.BatchMax},
		{"TransferBatchPagesMax", c.TransferBatchPagesMax}, {"MailboxMax", c.MailboxMax},
		{"TransferSendsMax", c.TransferSendsMax}, {"DonePlansMax", c.DonePlansMax},
	}
	if c.Role.Prefills() {
		ints = append(ints, intField{"PrefillWorkers", c.PrefillWorkers}, intField{"PrefillPages", c.PrefillPages})
	}
	if c.Role.Decodes() {
		ints = append(ints, intField{"DecodeWorkers", c.DecodeWorkers}, intField{"DecodePages", c.DecodePages})
	}
	for _, f := range ints {
		if f.v < 1 {
			return fmt.Errorf("actors: %s (%d) must be at least 1", f.name, f.v)
		}
	}
	for _, f := range []intField{{"PrefixCachePercent", c.PrefixCachePercent}, {"DecodeCachePercent", c.DecodeCachePercent}} {
		if f.v < 0 || f.v > 100 {
			return fmt.Errorf("actors: %s (%d) must be 0 (no prefix cache) to 100", f.name, f.v)
		}
	}
	if c.ContextTokens > c.Model.ContextTokens {
		return fmt.Errorf("actors: ContextTokens (%d) exceeds the model's context (%d)", c.ContextTokens, c.Model.ContextTokens)
	}
	// What admission lets through must fit the wire messages it becomes.
	if c.ContextTokens > messages.PromptTokensMax {
		return fmt.Errorf("actors: ContextTokens (%d) exceeds the %d prompt tokens a transfer plan carries",
			c.ContextTokens, messages.PromptTokensMax)
	}
	if pages := c.Geometry().PagesFor(c.ContextTokens); pages > messages.PlanTagsMax {
		return fmt.Errorf("actors: ContextTokens (%d) in pages of %d tokens needs %d pages, more than the %d tags a transfer plan carries",
			c.ContextTokens, c.PageTokens, pages, messages.PlanTagsMax)
	}
	if c.ContextTokens < c.PageTokens {
		return fmt.Errorf("actors: ContextTokens (%d) is below one page of PageTokens (%d)", c.ContextTokens, c.PageTokens)
	}
	// Every prompt is at least the model's BOS: a request of MaxTokensMax
	// tokens and the shortest prompt must fit the window.
	if c.MaxTokensMax >= c.ContextTokens {
		return fmt.Errorf("actors: MaxTokensMax (%d) leaves no room for a prompt in the ContextTokens (%d) window; want at most %d",
			c.MaxTokensMax, c.ContextTokens, c.ContextTokens-1)
	}
	if c.MaxTokensMax > messages.GenerateTokensMax {
		return fmt.Errorf("actors: MaxTokensMax (%d) exceeds the %d tokens a result carries", c.MaxTokensMax, messages.GenerateTokensMax)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"CallTimeout", c.CallTimeout}, {"RequestTimeout", c.RequestTimeout}, {"PrefillTimeout", c.PrefillTimeout},
		{"ReserveWait", c.ReserveWait}, {"ReserveRetry", c.ReserveRetry}, {"ReclaimAfter", c.ReclaimAfter},
		{"CacheSummaryEvery", c.CacheSummaryEvery},
	} {
		if d.v <= 0 {
			return fmt.Errorf("actors: %s (%s) must be positive", d.name, d.v)
		}
	}
	if c.OwnedPageTimeout <= max(c.RequestTimeout, c.PrefillTimeout) {
		return fmt.Errorf("actors: OwnedPageTimeout (%s) must exceed RequestTimeout (%s) and PrefillTimeout (%s)",
			c.OwnedPageTimeout, c.RequestTimeout, c.PrefillTimeout)
	}
	if err := c.BatchLimits().Validate(); err != nil {
		return err
	}
	for _, p := range []struct {
		role  string
		runs  bool
		pages int
	}{{"prefill", c.Role.Prefills(), c.PrefillPages}, {"decode", c.Role.Decodes(), c.DecodePages}} {
		if !p.runs {
			continue
		}
		if err := c.pool(p.pages, 1).Validate(); err != nil {
			return fmt.Errorf("actors: %s pool: %w", p.role, err)
		}
	}
	return nil
}
