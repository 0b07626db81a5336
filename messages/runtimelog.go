package messages

import (
	"context"
	"log/slog"
	"sync/atomic"
)

// RuntimeLog is the log protoactor itself writes to (endpoint chatter,
// dead letters, supervision notices): its records are counted by level
// and passed on at debug only, so that a node's log at info explains the
// node's own events while the runtime's are a count (RuntimeLogCounts)
// and, at --log-level debug, lines with their original level in
// runtime_level.
type RuntimeLog struct {
	next   slog.Handler
	counts *RuntimeLogCounts
}

// RuntimeLogCounts counts the runtime's records by level, from any
// goroutine.
type RuntimeLogCounts struct {
	Debug, Info, Warn, Error atomic.Uint64
}

// NewRuntimeLog folds the records of a logger built on it into log (nil
// discards them, counted all the same).
func NewRuntimeLog(log *slog.Logger) *RuntimeLog {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &RuntimeLog{next: log.Handler(), counts: &RuntimeLogCounts{}}
}

// Logger is the logger to give the runtime.
func (h *RuntimeLog) Logger() *slog.Logger { return slog.New(h) }

// Counts are the records counted so far.
func (h *RuntimeLog) Counts() *RuntimeLogCounts { return h.counts }

// Enabled is true at every level: every record is counted.
func (h *RuntimeLog) Enabled(context.Context, slog.Level) bool { return true }

// Handle counts r and passes it on at debug, if the next handler logs
// debug.
func (h *RuntimeLog) Handle(ctx context.Context, r slog.Record) error {
	switch {
	case r.Level >= slog.LevelError:
		h.counts.Error.Add(1)
	case r.Level >= slog.LevelWarn:
		h.counts.Warn.Add(1)
	case r.Level >= slog.LevelInfo:
		h.counts.Info.Add(1)
	default:
		h.counts.Debug.Add(1)
	}
	if !h.next.Enabled(ctx, slog.LevelDebug) {
		return nil
	}
	folded := slog.NewRecord(r.Time, slog.LevelDebug, r.Message, r.PC)
	folded.AddAttrs(slog.String("runtime_level", r.Level.String()))
	r.Attrs(func(a slog.Attr) bool {
		folded.AddAttrs(a)
		return true
	})
	return h.next.Handle(ctx, folded)
}

// WithAttrs and WithGroup keep the counts.
func (h *RuntimeLog) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &RuntimeLog{next: h.next.WithAttrs(attrs), counts: h.counts}
}

func (h *RuntimeLog) WithGroup(name string) slog.Handler {
	return &RuntimeLog{next: h.next.WithGroup(name), counts: h.counts}
}
