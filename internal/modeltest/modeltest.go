// Package modeltest builds, for tests and benchmarks outside package
// engine, the models they serve: a built-in model of a config, and
// stories260K (found by internal/stories), each once per test binary.
package modeltest

import (
	"sync"
	"testing"

	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/internal/stories"
	"github.com/kvwarden/kvwarden/kv"
)

// Builtin is the built-in model of cfg.
func Builtin(tb testing.TB, cfg engine.ModelConfig) *engine.Model {
	tb.Helper()
	return once(tb, cfg, func() (*engine.Model, error) { return engine.BuiltinModel(cfg) })
}

// Stories is stories260K with K and V of type dt in KV pages; without its
// files the test is skipped, or fails in CI (stories.Files).
func Stories(tb testing.TB, dt kv.DType) *engine.Model {
	tb.Helper()
	model, tok := stories.Files(tb)
	return once(tb, dt, func() (*engine.Model, error) { return engine.LoadModel(model, tok, dt) })
}

var models sync.Map // a config or a KV type → *engine.Model

func once(tb testing.TB, key any, build func() (*engine.Model, error)) *engine.Model {
	tb.Helper()
	if m, ok := models.Load(key); ok {
		return m.(*engine.Model)
	}
	m, err := build()
	if err != nil {
		tb.Fatal(err)
	}
	got, _ := models.LoadOrStore(key, m)
	return got.(*engine.Model)
}
