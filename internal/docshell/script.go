package main

import (
	"fmt"
	"strings"
)

// script is the bash script that runs cmds in order, each as written,
// printing each before it runs, and stops at the first whose exit status
// is not the one promised, naming it. Excluded commands are printed with
// why, not run.
func script(cmds []command) string {
	var b strings.Builder
	b.WriteString("set -o pipefail\n")
	for _, c := range cmds {
		if e := exclusionOf(c); e != nil {
			fmt.Fprintf(&b, "printf '\\n# %%s: left out (%%s): %%s\\n' %s %s %s >&2\n", quote(c.String()), quote(e.reason), quote(c.first()))
			continue
		}
		fmt.Fprintf(&b, "printf '\\n# %%s, at %%ss\\n$ %%s\\n' %s \"$SECONDS\" %s >&2\n", quote(c.String()), quote(c.text))
		b.WriteString(c.text)
		fmt.Fprintf(&b, "\n__rc=$?; if [ \"$__rc\" -ne %d ]; then printf '\\n%%s: exit %%s, want %d: %%s\\n' %s \"$__rc\" %s >&2; exit 1; fi\n",
			c.want, c.want, quote(c.String()), quote(c.first()))
	}
	b.WriteString("exit 0\n")
	return b.String()
}

// quote is s as one single-quoted bash word.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
