// Package ratelog bounds how often a process writes one kind of log line:
// whatever a stranger can make a node refuse, it cannot make the node
// write without bound. Lines over the rate are dropped and counted; the
// next line of the kind that is written says how many were dropped.
// Counting what was refused is the caller's job (metrics, status), and
// never rate limited.
package ratelog

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// KindsMax bounds the kinds a Limiter keeps a budget for; lines of kinds
// beyond it share one budget. Callers use a fixed set of kinds (constant
// strings), so the bound only guards against a caller's mistake.
const KindsMax = 256

// overflowKind is the budget the kinds beyond KindsMax share.
const overflowKind = "\x00overflow"

// Limiter lets each kind of line be written at most perSecond times a
// second on average, and at most perSecond at once after a quiet spell (a
// token bucket per kind). Safe for concurrent use; a nil *Limiter lets
// every line through.
type Limiter struct {
	perSecond int
	now       func() time.Time

	mu    sync.Mutex
	kinds map[string]*bucket
}

type bucket struct {
	tokens     float64
	last       time.Time
	suppressed uint64 // lines dropped since the last one written
}

// New is a Limiter of perSecond lines per kind per second, on the wall
// clock; perSecond must be at least 1.
func New(perSecond int) *Limiter { return NewWithClock(perSecond, time.Now) }

// NewWithClock is New on the clock now, for tests.
func NewWithClock(perSecond int, now func() time.Time) *Limiter {
	if perSecond < 1 {
		panic(fmt.Sprintf("ratelog: %d lines a second, want at least 1", perSecond))
	}
	return &Limiter{perSecond: perSecond, now: now, kinds: map[string]*bucket{}}
}

// Allow says whether a line of kind may be written now and, when it may,
// how many lines of the kind were dropped since the last one written.
func (l *Limiter) Allow(kind string) (ok bool, suppressed uint64) {
	if l == nil {
		return true, 0
	}
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	b, found := l.kinds[kind]
	if !found {
		if len(l.kinds) >= KindsMax {
			kind = overflowKind
			b = l.kinds[kind]
		}
		if b == nil {
			b = &bucket{tokens: float64(l.perSecond), last: now}
			l.kinds[kind] = b
		}
	}
	if elapsed := now.Sub(b.last); elapsed > 0 {
		b.tokens = min(float64(l.perSecond), b.tokens+elapsed.Seconds()*float64(l.perSecond))
		b.last = now
	}
	if b.tokens < 1 {
		b.suppressed++
		return false, 0
	}
	b.tokens--
	suppressed, b.suppressed = b.suppressed, 0
	return true, suppressed
}

// Log writes msg at level to log unless its kind is over the rate. A line
// written after some were dropped says how many in its message (so that a
// reader who greps messages sees it) and in the attribute "suppressed".
func (l *Limiter) Log(log *slog.Logger, level slog.Level, kind, msg string, args ...any) {
	if !log.Enabled(context.Background(), level) {
		return
	}
	ok, suppressed := l.Allow(kind)
	if !ok {
		return
	}
	if suppressed > 0 {
		msg = fmt.Sprintf("%s (and %d more like it not logged)", msg, suppressed)
		args = append(args, slog.Uint64("suppressed", suppressed))
	}
	log.Log(context.Background(), level, msg, args...)
}
