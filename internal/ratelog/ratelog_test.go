package ratelog

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func TestAllowSpendsABudgetPerKindAndCountsWhatItDrops(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	l := NewWithClock(3, c.now)
	for i := range 3 {
		if ok, s := l.Allow("a"); !ok || s != 0 {
			t.Fatalf("line %d of a fresh kind: ok %v, suppressed %d; want written, 0", i, ok, s)
		}
	}
	for i := range 10 {
		if ok, _ := l.Allow("a"); ok {
			t.Fatalf("line %d past the budget of 3 was let through", 4+i)
		}
	}
	if ok, _ := l.Allow("b"); !ok {
		t.Fatal("another kind shares the first kind's budget")
	}
	c.t = c.t.Add(time.Second / 2) // a line and a half's worth
	if ok, s := l.Allow("a"); !ok || s != 10 {
		t.Fatalf("after half a second: ok %v, suppressed %d; want written, 10", ok, s)
	}
	if ok, _ := l.Allow("a"); ok {
		t.Fatal("a second line within the same half second")
	}
	c.t = c.t.Add(time.Hour)
	for i := range 3 {
		if ok, _ := l.Allow("a"); !ok {
			t.Fatalf("line %d after an hour: the budget refills to 3", i)
		}
	}
	if ok, _ := l.Allow("a"); ok {
		t.Fatal("an hour's quiet saved more than a second's budget")
	}
}

func TestAllowBoundsItsKinds(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	l := NewWithClock(1, c.now)
	for i := range KindsMax + 100 {
		l.Allow(fmt.Sprint("kind-", i))
	}
	if n := len(l.kinds); n != KindsMax+1 {
		t.Fatalf("%d budgets kept, want %d and the shared one", n, KindsMax)
	}
}

func TestLogSaysHowManyWereDropped(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	l := NewWithClock(2, c.now)
	var out bytes.Buffer
	log := slog.New(slog.NewTextHandler(&out, nil))
	for range 1000 {
		l.Log(log, slog.LevelWarn, "refused", "refused: a stranger", "remote", "10.0.0.1:1")
	}
	c.t = c.t.Add(time.Second)
	l.Log(log, slog.LevelWarn, "refused", "refused: a stranger", "remote", "10.0.0.1:1")
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines for 1001 refusals in a second, want 3:\n%s", len(lines), out.String())
	}
	if !strings.Contains(lines[2], "(and 998 more like it not logged)") || !strings.Contains(lines[2], "suppressed=998") {
		t.Fatalf("the line after 998 dropped does not say so: %s", lines[2])
	}
	var nilLimiter *Limiter
	out.Reset()
	for range 5 {
		nilLimiter.Log(log, slog.LevelWarn, "x", "unbounded")
	}
	if n := strings.Count(out.String(), "\n"); n != 5 {
		t.Fatalf("a nil limiter wrote %d of 5 lines", n)
	}
}
