package main

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// command is one command of an sh block: its text as written (lines
// continued by a backslash included, comments kept), where it starts, and
// the exit status the page promises.
type command struct {
	file string
	line int
	text string
	want int
}

func (c command) String() string { return fmt.Sprintf("%s:%d", c.file, c.line) }

// first is the command's first line without its comment: what a reader
// would call the command.
func (c command) first() string {
	line, _, _ := strings.Cut(c.text, "\n")
	return strings.TrimSpace(strings.TrimSuffix(stripComment(line), "\\"))
}

// promised is a comment's "exits N".
var promised = regexp.MustCompile(`#.*\bexits (\d+)\b`)

// stripComment is line up to its comment: a # at the start or after a
// space, outside quotes.
func stripComment(line string) string {
	var quote rune
	for i, r := range line {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			}
		case r == '\'' || r == '"':
			quote = r
		case r == '#' && (i == 0 || line[i-1] == ' ' || line[i-1] == '\t'):
			return line[:i]
		}
	}
	return line
}

// fence is a fenced block's opening or closing line: its backticks and
// its info string.
var fence = regexp.MustCompile("^(```+)\\s*(\\S*)")

// commands are the commands of the sh blocks of a page named file.
func commands(file string, page string) ([]command, error) {
	var out []command
	var open string // the opening fence of the block we are in; "" outside
	var sh bool
	var cur *command
	for i, line := range strings.Split(page, "\n") {
		n := i + 1
		if m := fence.FindStringSubmatch(line); m != nil && (open == "" || strings.HasPrefix(m[1], open) && m[2] == "") {
			if open == "" {
				open, sh = m[1], m[2] == "sh"
				continue
			}
			if cur != nil {
				return nil, fmt.Errorf("%s:%d: the command continued by a backslash has no next line in its block", file, cur.line)
			}
			open = ""
			continue
		}
		if open == "" || !sh {
			continue
		}
		if cur == nil {
			if strings.TrimSpace(stripComment(line)) == "" {
				continue
			}
			cur = &command{file: file, line: n}
		} else {
			cur.text += "\n"
		}
		cur.text += line
		if strings.HasSuffix(strings.TrimSpace(stripComment(line)), "\\") {
			continue
		}
		if m := promised.FindStringSubmatch(line); m != nil {
			cur.want, _ = strconv.Atoi(m[1])
		}
		out = append(out, *cur)
		cur = nil
	}
	if open != "" {
		return nil, fmt.Errorf("%s: a block opened with %s is not closed", file, open)
	}
	return out, nil
}

// exclusion leaves out of the run every command that starts with prefix,
// for reason.
type exclusion struct {
	prefix, reason string
}

// excluded are the commands of the pages that do not run here, each with
// why. The tests fail on an entry that matches no command.
var excluded = []exclusion{
	{"go test ./...", "the suite: .ci/run runs it as a step of its own (and it would run this program's tests again)"},
	{"go test ./chaos/sim", "the simulator's sweeps: go test ./... runs the default one; the others take minutes"},
	{"go test ./kv -run '^$'", "benchmarks and fuzzing: measurements of minutes, not checks"},
	{"go test ./engine -run '^$'", "benchmarks: measurements of minutes, not checks"},
	{"go test ./cluster -run '^$'", "benchmarks: measurements of minutes, not checks"},
	{"go test ./actors -run '^$'", "benchmarks: measurements of minutes, not checks"},
	{"go test ./messages -run '^$'", "benchmarks: measurements of minutes, not checks"},
	{"formal/check.sh", ".ci/run runs the formal model as a step of its own"},
	{"bash chaos/mutants.sh", ".ci/run runs the mutant matrix as a step of its own"},
	{"bin/node-chaos chaos --seed 1 --requests 1000 ", ".ci/run runs this campaign as a step of its own"},
	{"bin/node-chaos chaos --seed 1 --requests 10000", "the bench-size campaign: about 20 minutes"},
	{"bin/node-chaos chaos --seed 1 --requests 0 --duration 20s", ".ci/run runs this campaign of drains as a step of its own"},
	{"bin/node-chaos chaos --endpoint 10.0.0.5:7070", "a cluster at a remote address, with its own credentials"},
	{"go run ./cmd/node bench --rates 2,4,8,16", "a sweep of four rates: minutes"},
	{"go run ./cmd/node bench --compare 2", "three layouts at four rates each: ten minutes"},
}

// exclusionOf is the exclusion that leaves c out, or nil.
func exclusionOf(c command) *exclusion {
	for i, e := range excluded {
		if strings.HasPrefix(c.first()+" ", e.prefix) {
			return &excluded[i]
		}
	}
	return nil
}
