package live

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/kvwarden/kvwarden/messages"
)

// Streams of the campaign's random numbers: each use draws from its own
// stream of the one seed, so that adding requests does not move a fault.
const (
	streamSchedule uint64 = 0x5c4ed01e
	streamWorkload uint64 = 0x3011c0ad
	streamRequest  uint64 = 0x4e9ce570
)

// newRand is the generator of one stream of seed.
func newRand(seed, stream uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, stream)) }

// ScheduleConfig bounds the faults a schedule draws.
type ScheduleConfig struct {
	// Kinds are the kinds drawn from, each once in a seeded order in the
	// first len(Kinds) faults and uniformly after. Frames is not drawn
	// (it is on for the whole campaign) and may be listed or not.
	Kinds []Kind
	// Every is the mean time between two fault starts; each gap is drawn
	// from [Every/2, 3·Every/2].
	Every time.Duration
	// LengthMin and LengthMax bound a fault's window: how long a node is
	// down, paused, cut off or slowed.
	LengthMin, LengthMax time.Duration
	// AtOnceMax is the most faults whose windows overlap; at least 1.
	AtOnceMax int
	// Roles are the roles kill, pause and partition may hit. Of each role
	// with more than one node, at least one is spared at any time. A drain
	// hits decode nodes whatever Roles says, and spares one of them as
	// well: the one its requests move to.
	Roles []string
	// LatencyMax bounds the delay a latency fault adds in each
	// direction: drawn from [LatencyMax/4, LatencyMax].
	LatencyMax time.Duration
	// BandwidthKiBps is the rate a bandwidth fault allows in each
	// direction, in KiB/s; at least 1.
	BandwidthKiBps int
	// PressurePagesMax bounds the pages a pressure fault holds: drawn
	// from [1, PressurePagesMax].
	PressurePagesMax int
}

// DefaultScheduleConfig is a fault every two seconds, each up to three
// seconds long, at most two at once, on prefill and decode nodes.
func DefaultScheduleConfig() ScheduleConfig {
	return ScheduleConfig{Kinds: AllKinds(), Every: 2 * time.Second, LengthMin: 500 * time.Millisecond,
		LengthMax: 3 * time.Second, AtOnceMax: 2, Roles: []string{messages.RolePrefill, messages.RoleDecode},
		LatencyMax: 200 * time.Millisecond, BandwidthKiBps: 256, PressurePagesMax: 64}
}

// faultWindowMax bounds a fault window: the longest a node may hold pages
// under pressure.
const faultWindowMax = messages.PressureDurationMsMax * time.Millisecond

// Validate reports the first setting out of range, with its value.
func (c ScheduleConfig) Validate() error {
	switch {
	case c.Every <= 0:
		return fmt.Errorf("live: the mean time between faults (%s) must be positive", c.Every)
	case c.LengthMin <= 0 || c.LengthMax < c.LengthMin || c.LengthMax > faultWindowMax:
		return fmt.Errorf("live: fault windows from %s to %s: want 0 < min ≤ max ≤ %s", c.LengthMin, c.LengthMax, faultWindowMax)
	case c.AtOnceMax < 1:
		return fmt.Errorf("live: faults at once (%d) must be at least 1", c.AtOnceMax)
	case c.LatencyMax < 4*time.Millisecond:
		return fmt.Errorf("live: latency (%s) must be at least 4ms", c.LatencyMax)
	case c.BandwidthKiBps < 1:
		return fmt.Errorf("live: bandwidth (%d KiB/s) must be at least 1", c.BandwidthKiBps)
	case c.PressurePagesMax < 1 || c.PressurePagesMax > messages.PressurePagesMax:
		return fmt.Errorf("live: pressure pages (%d) must be 1 to %d", c.PressurePagesMax, messages.PressurePagesMax)
	}
	for _, r := range c.Roles {
		if r != messages.RolePrefill && r != messages.RoleDecode && r != messages.RoleRouter && r != messages.RoleAll {
			return fmt.Errorf("live: role %q: want prefill, decode, router or all", r)
		}
	}
	return nil
}

// Target is a node a fault may hit.
type Target struct {
	Name string // as the campaign names it: router-0, prefill-1, …
	Role string // messages.RolePrefill, …
}

// Fault is one fault of a schedule.
type Fault struct {
	// Seq numbers the faults of a schedule from 0.
	Seq    int
	Kind   Kind
	Target string
	// At is when the window starts, since the campaign's start; For is
	// its length.
	At, For time.Duration
	// Latency is a latency fault's delay in each direction.
	Latency time.Duration
	// BandwidthKiBps is a bandwidth fault's rate.
	BandwidthKiBps int
	// Pages is how many pages a pressure fault holds.
	Pages int
	// Seed seeds what the fault itself draws: the rogue's guesses.
	Seed uint64
}

// end is when the window ends.
func (f Fault) end() time.Duration { return f.At + f.For }

func (f Fault) String() string {
	s := fmt.Sprintf("#%d %s %s at %s for %s", f.Seq, f.Kind, f.Target, f.At.Round(time.Millisecond), f.For.Round(time.Millisecond))
	switch f.Kind {
	case Latency:
		s += fmt.Sprintf(" (+%s each way)", f.Latency)
	case Bandwidth:
		s += fmt.Sprintf(" (%d KiB/s)", f.BandwidthKiBps)
	case Pressure:
		s += fmt.Sprintf(" (%d pages)", f.Pages)
	}
	return s
}

// Schedule is the faults of one seed, drawn one at a time: the same seed,
// configuration and targets give the same faults in the same order,
// whatever the campaign does meanwhile. It is not safe for concurrent
// use.
type Schedule struct {
	cfg     ScheduleConfig
	targets []Target
	kinds   []Kind // the scheduled kinds of cfg.Kinds
	first   []Kind // a seeded order of kinds for the first faults
	rnd     *rand.Rand
	seq     int
	at      time.Duration
	open    []Fault // drawn faults whose windows may overlap the next
}

// ErrNothingToSchedule is a schedule of no kind that may be drawn.
var ErrNothingToSchedule = errors.New("live: no fault kind to schedule")

// NewSchedule validates cfg and checks that every kind has a target.
func NewSchedule(seed uint64, cfg ScheduleConfig, targets []Target) (*Schedule, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Schedule{cfg: cfg, targets: slices.Clone(targets), rnd: newRand(seed, streamSchedule)}
	for _, k := range cfg.Kinds {
		if !k.scheduled() || slices.Contains(s.kinds, k) {
			continue
		}
		if len(s.eligible(k, 0, 0)) == 0 {
			if k == Drain {
				return nil, fmt.Errorf("live: a drain fault needs %d decode nodes, one to drain and one to take its requests: %d among %d targets",
					drainDecodesMin, s.decodes(), len(targets))
			}
			return nil, fmt.Errorf("live: no node a %s fault may hit among %d targets (roles %v)", k, len(targets), cfg.Roles)
		}
		s.kinds = append(s.kinds, k)
	}
	if len(s.kinds) == 0 {
		return nil, ErrNothingToSchedule
	}
	s.first = slices.Clone(s.kinds)
	s.rnd.Shuffle(len(s.first), func(i, j int) { s.first[i], s.first[j] = s.first[j], s.first[i] })
	return s, nil
}

// Kinds are the kinds the schedule draws.
func (s *Schedule) Kinds() []Kind { return slices.Clone(s.kinds) }

// Next draws the next fault. Its window starts a drawn gap after the last
// one's start, or later, when the faults already drawn leave no target
// for it: at most AtOnceMax windows overlap, none two on one node, and a
// disruptive fault spares a node of its target's role.
func (s *Schedule) Next() Fault {
	gap := s.cfg.Every/2 + time.Duration(s.rnd.Int64N(int64(s.cfg.Every)+1))
	s.at += gap
	kind := s.first[min(s.seq, len(s.first)-1)]
	if s.seq >= len(s.first) {
		kind = s.kinds[s.rnd.IntN(len(s.kinds))]
	}
	length := s.cfg.LengthMin + time.Duration(s.rnd.Int64N(int64(s.cfg.LengthMax-s.cfg.LengthMin)+1))
	for {
		s.open = slices.DeleteFunc(s.open, func(f Fault) bool { return f.end() <= s.at })
		if len(s.open) < s.cfg.AtOnceMax {
			if ts := s.eligible(kind, s.at, length); len(ts) > 0 {
				f := s.fault(kind, ts[s.rnd.IntN(len(ts))], length)
				s.open = append(s.open, f)
				s.seq++
				return f
			}
		}
		// Nothing fits now; the open windows end, so something will.
		first := slices.MinFunc(s.open, func(a, b Fault) int { return cmp.Compare(a.end(), b.end()) })
		s.at = first.end()
	}
}

func (s *Schedule) fault(kind Kind, target Target, length time.Duration) Fault {
	f := Fault{Seq: s.seq, Kind: kind, Target: target.Name, At: s.at, For: length, Seed: s.rnd.Uint64()}
	switch kind {
	case Latency:
		lo := s.cfg.LatencyMax / 4
		f.Latency = (lo + time.Duration(s.rnd.Int64N(int64(s.cfg.LatencyMax-lo)+1))).Round(time.Millisecond)
	case Bandwidth:
		f.BandwidthKiBps = s.cfg.BandwidthKiBps
	case Pressure:
		f.Pages = 1 + s.rnd.IntN(s.cfg.PressurePagesMax)
	}
	return f
}

// eligible are the targets a fault of kind may hit in [at, at+length),
// given the open windows.
func (s *Schedule) eligible(kind Kind, at, length time.Duration) []Target {
	var out []Target
	for _, t := range s.targets {
		if s.fits(kind, t) && !s.overlaps(t, at, length, kind) {
			out = append(out, t)
		}
	}
	return out
}

// fits says whether kind may ever hit t.
func (s *Schedule) fits(kind Kind, t Target) bool {
	switch {
	case kind == Drain:
		return decodes(t.Role) && s.decodes() >= drainDecodesMin
	case kind.disrupts():
		return slices.Contains(s.cfg.Roles, t.Role)
	case kind == Pressure:
		return t.Role != messages.RoleRouter
	case kind == Rogue:
		return t.Role == messages.RoleDecode || t.Role == messages.RoleAll
	}
	return true
}

// overlaps says whether a fault on t in [at, at+length) would meet an
// open window on t, or leave no node of t's role undisrupted.
func (s *Schedule) overlaps(t Target, at, length time.Duration, kind Kind) bool {
	disrupted := 0
	for _, f := range s.open {
		if f.At >= at+length || f.end() <= at {
			continue
		}
		if f.Target == t.Name {
			return true
		}
		if f.Kind.disrupts() && s.roleOf(f.Target) == t.Role {
			disrupted++
		}
	}
	if !kind.disrupts() {
		return false
	}
	return disrupted >= max(s.count(t.Role)-1, 1)
}

func (s *Schedule) roleOf(name string) string {
	for _, t := range s.targets {
		if t.Name == name {
			return t.Role
		}
	}
	return ""
}

func (s *Schedule) count(role string) int {
	n := 0
	for _, t := range s.targets {
		if t.Role == role {
			n++
		}
	}
	return n
}

// drainDecodesMin is how many decode nodes a drain needs: the one drained
// and one to take its requests.
const drainDecodesMin = 2

// decodes says whether a node of role runs decode.
func decodes(role string) bool { return role == messages.RoleDecode || role == messages.RoleAll }

// decodes counts the targets that run decode.
func (s *Schedule) decodes() int {
	n := 0
	for _, t := range s.targets {
		if decodes(t.Role) {
			n++
		}
	}
	return n
}
