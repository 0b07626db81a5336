package actors

import (
	"slices"
	"sync/atomic"
	"time"

	"github.com/kvwarden/kvwarden/messages"
)

// LatencyBounds are the upper bounds of a Latency's buckets, from 1 ms to
// a minute: a time to first token or a whole request on a loaded node
// spans that range, and a gap between two tokens its lower end.
func LatencyBounds() []time.Duration { return slices.Clone(latencyBounds[:]) }

var latencyBounds = [...]time.Duration{time.Millisecond, 2500 * time.Microsecond, 5 * time.Millisecond,
	10 * time.Millisecond, 25 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond,
	250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2500 * time.Millisecond, 5 * time.Second,
	10 * time.Second, 30 * time.Second, time.Minute}

// Latency is a histogram of durations over LatencyBounds, observed from
// any goroutine: a fixed number of counters, whatever the traffic.
type Latency struct {
	buckets [len(latencyBounds) + 1]atomic.Uint64 // the last counts what exceeds every bound
	sum     atomic.Int64                          // nanoseconds
}

// Observe counts d.
func (l *Latency) Observe(d time.Duration) {
	i := 0
	for i < len(latencyBounds) && d > latencyBounds[i] {
		i++
	}
	l.buckets[i].Add(1)
	l.sum.Add(int64(d))
}

// Count is how many durations were observed.
func (l *Latency) Count() uint64 {
	var n uint64
	for i := range l.buckets {
		n += l.buckets[i].Load()
	}
	return n
}

// LatencySnapshot is a Latency at one moment: Counts[i] observations of
// at most LatencyBounds()[i] and more than the bound before it, the last
// one past every bound.
type LatencySnapshot struct {
	Counts []uint64
	Sum    time.Duration
}

// Snapshot reads the histogram; each counter is read atomically, the set
// is not.
func (l *Latency) Snapshot() LatencySnapshot {
	s := LatencySnapshot{Counts: make([]uint64, len(l.buckets)), Sum: time.Duration(l.sum.Load())}
	for i := range l.buckets {
		s.Counts[i] = l.buckets[i].Load()
	}
	return s
}

// Add is the sum of two snapshots.
func (s LatencySnapshot) Add(o LatencySnapshot) LatencySnapshot {
	return LatencySnapshot{Counts: messages.SumCounts(s.Counts, o.Counts), Sum: s.Sum + o.Sum}
}

// Latencies are a node's request latencies: time to first token, the gap
// between two tokens of a stream, and the whole request, for the requests
// the node admitted (or, a router, relayed).
type Latencies struct {
	TTFT, InterToken, EndToEnd Latency
}

// Tokens counts the tokens streamed: each is timed once, the first of a
// stream as its time to first token and every other as the gap before it.
func (l *Latencies) Tokens() uint64 { return l.TTFT.Count() + l.InterToken.Count() }

// LatenciesSnapshot is Latencies at one moment.
type LatenciesSnapshot struct {
	TTFT, InterToken, EndToEnd LatencySnapshot
}

// Snapshot reads every histogram.
func (l *Latencies) Snapshot() LatenciesSnapshot {
	return LatenciesSnapshot{TTFT: l.TTFT.Snapshot(), InterToken: l.InterToken.Snapshot(), EndToEnd: l.EndToEnd.Snapshot()}
}

// Add is the sum of two snapshots.
func (s LatenciesSnapshot) Add(o LatenciesSnapshot) LatenciesSnapshot {
	return LatenciesSnapshot{TTFT: s.TTFT.Add(o.TTFT), InterToken: s.InterToken.Add(o.InterToken), EndToEnd: s.EndToEnd.Add(o.EndToEnd)}
}

// Stream times one request's tokens into a Latencies, from Start: when
// the node took the request.
type Stream struct {
	Start time.Time
	last  time.Time
}

// Token counts a token sent at now: the first as the time to first token,
// the others as the gap since the one before.
func (s *Stream) Token(l *Latencies, now time.Time) {
	if s.last.IsZero() {
		l.TTFT.Observe(now.Sub(s.Start))
	} else {
		l.InterToken.Observe(now.Sub(s.last))
	}
	s.last = now
}

// End counts the request's end, at now, as its whole time.
func (s *Stream) End(l *Latencies, now time.Time) { l.EndToEnd.Observe(now.Sub(s.Start)) }
