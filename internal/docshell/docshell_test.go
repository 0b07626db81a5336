package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// page is a page with every kind of line the convention knows.
const page = "# A page\n\n" +
	"```sh\n" +
	"# a comment alone is no command\n" +
	"echo one   # a comment after it\n" +
	"printf '%s\\n' \\\n" +
	"       'continued' \\\n" +
	"       '# no comment in quotes'\n" +
	"\n" +
	"false      # exits 1, as it says\n" +
	"```\n\n" +
	"```text\n$ echo output, not a command\n```\n\n" +
	"```go\nfmt.Println(\"neither\")\n```\n"

func TestCommands(t *testing.T) {
	cmds, err := commands("page.md", page)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range cmds {
		got = append(got, c.String()+" "+strings.ReplaceAll(c.text, "\n", "⏎")+" want "+string(rune('0'+c.want)))
	}
	want := []string{
		"page.md:5 echo one   # a comment after it want 0",
		"page.md:6 printf '%s\\n' \\⏎       'continued' \\⏎       '# no comment in quotes' want 0",
		"page.md:10 false      # exits 1, as it says want 1",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("commands:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if first := cmds[1].first(); first != "printf '%s\\n'" {
		t.Errorf("first line of a continued command: %q", first)
	}
}

func TestCommandsRefusesBrokenBlocks(t *testing.T) {
	for _, tc := range []struct{ page, want string }{
		{"```sh\necho open\n", "a block opened with ``` is not closed"},
		{"```sh\necho \\\n```\n", "page.md:2: the command continued by a backslash has no next line"},
	} {
		if _, err := commands("page.md", tc.page); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.page, err, tc.want)
		}
	}
}

// TestScriptVerdicts runs scripts with bash: commands that exit as
// promised pass, in order, sharing the shell's state; the first that does
// not stops the script, named with its place and status; an excluded
// command does not run.
func TestScriptVerdicts(t *testing.T) {
	for _, tc := range []struct {
		name, page string
		pass       bool
		want       string
	}{
		{"as promised", "```sh\nexport X=1\ntest \"$X\" = 1\nfalse   # exits 1\nsleep 30 &\nkill %1; wait\n```\n", true, "$ kill %1; wait"},
		{"a failure", "```sh\ntrue\nfalse\necho after\n```\n", false, "p.md:3: exit 1, want 0: false"},
		{"a promise broken", "```sh\ntrue   # exits 3\n```\n", false, "p.md:2: exit 0, want 3: true"},
		{"a pipeline", "```sh\nfalse | cat\n```\n", false, "exit 1, want 0: false | cat"},
		{"left out", "```sh\ngo test ./...\n```\n", true, "left out (the suite"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmds, err := commands("p.md", tc.page)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			out, err := exec.CommandContext(ctx, "bash", "-c", script(cmds)).CombinedOutput()
			if ctx.Err() != nil {
				t.Fatalf("the script did not end within a minute:\n%s", out)
			}
			if (err == nil) != tc.pass || !strings.Contains(string(out), tc.want) || strings.Contains(string(out), "after") {
				t.Errorf("passed %v (%v), want %v with %q:\n%s", err == nil, err, tc.pass, tc.want, out)
			}
		})
	}
}

// repoPages are the repository's pages, as the run takes them.
func repoPages(t *testing.T) (string, []string) {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	pages, err := defaultPages(root)
	if err != nil {
		t.Fatal(err)
	}
	return root, pages
}

// TestLinks: every relative link of the README and docs/ names a file of
// the repository and, with an anchor, one of that page's headings.
func TestLinks(t *testing.T) {
	root, pages := repoPages(t)
	problems, _, err := checkLinks(root, pages)
	if err != nil {
		t.Fatal(err)
	}
	if len(problems) > 0 {
		t.Errorf("broken links:\n%s", strings.Join(problems, "\n"))
	}
	bad := []link{{file: "README.md", target: "docs/nowhere.md"}, {file: "README.md", target: "#no-such-heading"},
		{file: "docs/chaos.md", target: "../README.md#no-such-heading"}, {file: "README.md", target: "../outside.md"}}
	for _, l := range bad {
		if checkLink(root, l) == "" {
			t.Errorf("%s in %s passed", l.target, l.file)
		}
	}
}

func TestAnchors(t *testing.T) {
	got := anchors("# kvwarden\n## The OpenAI-compatible API\n### `node up`: a cluster, by hand…\n```sh\n# not a heading\n```\n")
	for _, want := range []string{"kvwarden", "the-openai-compatible-api", "node-up-a-cluster-by-hand"} {
		if !got[want] {
			t.Errorf("no anchor %q in %v", want, got)
		}
	}
	if got["not-a-heading"] {
		t.Errorf("a comment in a code block made an anchor")
	}
}

// TestExclusionsMatchThePages: every exclusion leaves out a command of the
// pages (none is stale), and the pages' commands parse.
func TestExclusionsMatchThePages(t *testing.T) {
	root, pages := repoPages(t)
	used := map[string]bool{}
	for _, p := range pages {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		cmds, err := commands(p, string(b))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cmds {
			if e := exclusionOf(c); e != nil {
				used[e.prefix] = true
			}
		}
	}
	for _, e := range excluded {
		if !used[e.prefix] {
			t.Errorf("the exclusion of %q (%s) leaves out no command of %v", e.prefix, e.reason, pages)
		}
	}
}
