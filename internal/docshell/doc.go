// Command docshell runs the shell blocks of the README and of docs/ as
// written, against real processes, and fails at the first command whose
// exit status is not the one the text promises.
//
//	go run ./internal/docshell                  # README.md, then docs/*.md
//	go run ./internal/docshell -list            # what would run, and what is left out and why
//	go run ./internal/docshell docs/trust.md    # one page
//
// # The convention a page follows
//
// Only fenced blocks marked sh run; examples of output are marked text.
// Each line of an sh block is a command (a line ending in a backslash goes
// on on the next), and a line that is only a comment is none. A command
// must exit 0, unless its comment says "exits N": then it must exit N.
// The commands of one page run in order in one bash (with pipefail), so
// that one command's exports, files and background jobs (&, %1, wait) are
// there for the next, as they would be in the reader's shell; a page must
// stop what it starts. A command that cannot run here is left out by
// excluded (prefix and reason), which the tests check against the pages.
//
// Each page runs in a copy of the repository's files (git ls-files), beside
// a link to the repository's ../shared, with TMPDIR in the copy, so that
// nothing is left in the checkout and each page starts from a clean tree.
// Every port of 127.0.0.1 the page names must be free before it starts.
// After a page, a process still running in its copy (found by its working
// directory in /proc) fails it and is killed. The whole run is bounded
// by -timeout.
//
// The package's tests (go test ./...) check the parts without running a
// page: the parser, the exclusions against the real pages, every link of
// the pages (files and anchors), and a script's verdict on commands that
// exit as promised and as not.
package main
