package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"unicode"
)

// inlineLink is a Markdown link, [text](target), and codeSpan a span of
// inline code, in which brackets are no link.
var (
	inlineLink = regexp.MustCompile(`\[[^\]]*\]\(([^)\s]+)\)`)
	codeSpan   = regexp.MustCompile("`[^`]*`")
	heading    = regexp.MustCompile(`^#{1,6}\s+(.*)$`)
)

// link is a link of a page outside its fenced blocks.
type link struct {
	file   string
	line   int
	target string
}

// pageText calls each with the lines of page outside its fenced blocks.
func pageText(page string, each func(n int, line string)) {
	open := ""
	for i, line := range strings.Split(page, "\n") {
		if m := fence.FindStringSubmatch(line); m != nil && (open == "" || strings.HasPrefix(m[1], open) && m[2] == "") {
			if open == "" {
				open = m[1]
			} else {
				open = ""
			}
			continue
		}
		if open == "" {
			each(i+1, line)
		}
	}
}

// links are the links of the page named file.
func links(file, page string) []link {
	var out []link
	pageText(page, func(n int, line string) {
		for _, m := range inlineLink.FindAllStringSubmatch(codeSpan.ReplaceAllString(line, ""), -1) {
			out = append(out, link{file: file, line: n, target: m[1]})
		}
	})
	return out
}

// anchors are the anchors of page's headings, as GitHub makes them:
// lower case, letters, digits, - and _ kept, spaces made -, the rest
// dropped.
func anchors(page string) map[string]bool {
	out := map[string]bool{}
	pageText(page, func(_ int, line string) {
		m := heading.FindStringSubmatch(line)
		if m == nil {
			return
		}
		var b strings.Builder
		for _, r := range strings.ToLower(m[1]) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		out[b.String()] = true
	})
	return out
}

// checkLinks checks every link of the pages (paths relative to root): a
// relative one must name a file or directory of the repository, and its
// #anchor, or a page's own, one of that page's headings. A link to
// another site is not followed: the machines this runs on may reach no
// network; external counts them.
func checkLinks(root string, pages []string) (problems []string, external int, err error) {
	for _, p := range pages {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			return nil, 0, err
		}
		for _, l := range links(p, string(b)) {
			if strings.Contains(l.target, "://") || strings.HasPrefix(l.target, "mailto:") {
				external++
				continue
			}
			if problem := checkLink(root, l); problem != "" {
				problems = append(problems, fmt.Sprintf("%s:%d: %s: %s", l.file, l.line, l.target, problem))
			}
		}
	}
	return problems, external, nil
}

// checkLink says what is wrong with a relative link, or "".
func checkLink(root string, l link) string {
	path, anchor, _ := strings.Cut(l.target, "#")
	target := filepath.Join(filepath.Dir(l.file), path)
	if path == "" {
		target = l.file
	}
	if rel, err := filepath.Rel(root, filepath.Join(root, target)); err != nil || strings.HasPrefix(rel, "..") {
		return "outside the repository"
	}
	b, err := os.ReadFile(filepath.Join(root, target))
	if err != nil {
		if st, serr := os.Stat(filepath.Join(root, target)); serr == nil && st.IsDir() && anchor == "" {
			return ""
		}
		return "no such file"
	}
	if anchor != "" && (!strings.HasSuffix(target, ".md") || !anchors(string(b))[anchor]) {
		return fmt.Sprintf("%s has no heading with anchor #%s", target, anchor)
	}
	return ""
}
