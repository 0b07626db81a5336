package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"
)

func main() {
	timeout := flag.Duration("timeout", 10*time.Minute, "bound on the whole run; past it the page running is stopped and fails")
	list := flag.Bool("list", false, "print what would run, and what is left out and why, and run nothing")
	keep := flag.Bool("keep", false, "keep each page's copy of the repository (its logs and files) and say where")
	flag.Parse()
	if err := run(flag.Args(), *timeout, *list, *keep, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "docshell:", err)
		os.Exit(1)
	}
}

// run runs the pages (default: README.md, then docs/*.md) of the
// repository around the working directory, one after the other, within
// timeout.
func run(pages []string, timeout time.Duration, list, keep bool, out io.Writer) error {
	root, err := repoRoot()
	if err != nil {
		return err
	}
	if len(pages) == 0 {
		if pages, err = defaultPages(root); err != nil {
			return err
		}
	}
	problems, external, err := checkLinks(root, pages)
	if err != nil {
		return err
	}
	if len(problems) > 0 {
		return fmt.Errorf("broken links:\n%s", strings.Join(problems, "\n"))
	}
	fmt.Fprintf(out, "links: every relative link of %d pages resolves; %d to other sites not followed\n", len(pages), external)
	if list {
		return forPages(root, pages, func(p string, cmds []command) error { printPlan(out, cmds); return nil })
	}
	w, err := newWorkspace(root, keep, out)
	if err != nil {
		return err
	}
	defer w.close()
	deadline := time.Now().Add(timeout)
	return forPages(root, pages, func(p string, cmds []command) error { return w.runPage(p, cmds, deadline, out) })
}

// forPages calls each with every page's commands, in order.
func forPages(root string, pages []string, each func(page string, cmds []command) error) error {
	for _, p := range pages {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			return err
		}
		cmds, err := commands(p, string(b))
		if err != nil {
			return err
		}
		if err := each(p, cmds); err != nil {
			return err
		}
	}
	return nil
}

// repoRoot is the directory above the working directory that holds
// go.mod.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory: run this in the repository")
		}
		dir = parent
	}
}

// defaultPages are README.md and docs/*.md, relative to root.
func defaultPages(root string) ([]string, error) {
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		return nil, err
	}
	slices.Sort(docs)
	pages := []string{"README.md"}
	for _, d := range docs {
		rel, _ := filepath.Rel(root, d)
		pages = append(pages, rel)
	}
	return pages, nil
}

func printPlan(out io.Writer, cmds []command) {
	for _, c := range cmds {
		if e := exclusionOf(c); e != nil {
			fmt.Fprintf(out, "%s: left out (%s): %s\n", c, e.reason, c.first())
		} else {
			fmt.Fprintf(out, "%s: runs, wants exit %d: %s\n", c, c.want, c.first())
		}
	}
}

// workspace is the copy of the repository the pages run in: one for
// the whole run, so that the module is compiled once at its path, and put
// back as it was copied before each page.
type workspace struct {
	scratch, repo string
	keep          bool
	files         map[string]bool // the copy's files and directories, relative to repo
}

func newWorkspace(root string, keep bool, out io.Writer) (*workspace, error) {
	scratch, err := os.MkdirTemp("", "docshell-")
	if err != nil {
		return nil, err
	}
	// As /proc names the processes' working directories.
	if scratch, err = filepath.EvalSymlinks(scratch); err != nil {
		return nil, err
	}
	w := &workspace{scratch: scratch, keep: keep, files: map[string]bool{}}
	if keep {
		fmt.Fprintf(out, "the copy of the repository the pages run in is kept: %s\n", scratch)
	}
	if w.repo, err = copyRepo(root, scratch); err != nil {
		w.close()
		return nil, err
	}
	err = filepath.WalkDir(w.repo, func(path string, _ os.DirEntry, err error) error {
		rel, _ := filepath.Rel(w.repo, path)
		w.files[rel] = true
		return err
	})
	return w, err
}

func (w *workspace) close() {
	if !w.keep {
		os.RemoveAll(w.scratch)
	}
}

// reset removes what the pages made in the copy, and its temporary
// directory, and makes that anew.
func (w *workspace) reset() error {
	var made []string
	err := filepath.WalkDir(w.repo, func(path string, d os.DirEntry, err error) error {
		rel, _ := filepath.Rel(w.repo, path)
		if err == nil && !w.files[rel] {
			made = append(made, path)
			if d.IsDir() {
				return filepath.SkipDir
			}
		}
		return err
	})
	for _, p := range made {
		err = errors.Join(err, os.RemoveAll(p))
	}
	tmp := filepath.Join(w.scratch, "tmp")
	return errors.Join(err, os.RemoveAll(tmp), os.Mkdir(tmp, 0o700))
}

// runPage runs the commands of page in the copy, put back as it was.
func (w *workspace) runPage(page string, cmds []command, deadline time.Time, out io.Writer) error {
	if err := portsFree(cmds); err != nil {
		return err
	}
	if err := w.reset(); err != nil {
		return err
	}
	fmt.Fprintf(out, "\n=== %s: %d commands\n", page, len(cmds))
	start := time.Now()
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	bash := exec.CommandContext(ctx, "bash", "-c", script(cmds))
	bash.Dir = w.repo
	bash.Env = append(withoutEnv(os.Environ(), "KVWARDEN_CERTS", "TMPDIR"), "TMPDIR="+filepath.Join(w.scratch, "tmp"))
	bash.Stdout, bash.Stderr = out, out
	bash.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	bash.Cancel = func() error { return syscall.Kill(-bash.Process.Pid, syscall.SIGKILL) }
	bash.WaitDelay = 10 * time.Second
	runErr := bash.Run()
	left := leftovers(w.scratch)
	if ctx.Err() != nil {
		runErr = fmt.Errorf("%s did not finish within -timeout (the last command printed above was running)", page)
	} else if runErr != nil {
		runErr = fmt.Errorf("%s: %w", page, runErr)
	}
	if len(left) > 0 {
		runErr = errors.Join(runErr, fmt.Errorf("%s leaves processes running (killed now):\n%s", page, strings.Join(left, "\n")))
	}
	if runErr != nil {
		return runErr
	}
	fmt.Fprintf(out, "\n=== %s: every command exited as it says, in %s\n", page, time.Since(start).Round(time.Second))
	return nil
}

// withoutEnv is env without the variables named.
func withoutEnv(env []string, names ...string) []string {
	return slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return slices.Contains(names, name)
	})
}

// port is an address of loopback a command names.
var port = regexp.MustCompile(`127\.0\.0\.1:([1-9][0-9]{1,4})\b`)

// portsFree fails when a port of 127.0.0.1 that cmds name is taken: the
// page would fail for a reason of this machine's.
func portsFree(cmds []command) error {
	for _, c := range cmds {
		for _, m := range port.FindAllStringSubmatch(c.text, -1) {
			ln, err := net.Listen("tcp", m[0])
			if err != nil {
				return fmt.Errorf("%s names %s, which is taken on this machine (%v): the page needs it free", c, m[0], err)
			}
			ln.Close()
		}
	}
	return nil
}

// copyRepo copies the repository's files (tracked, and untracked but not
// ignored) into scratch/repo, and links scratch/shared to the
// repository's ../shared, if there is one, where the pages find the model.
func copyRepo(root, scratch string) (string, error) {
	files, err := exec.Command("git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		return "", fmt.Errorf("listing the repository's files: %w", err)
	}
	work := filepath.Join(scratch, "repo")
	for _, f := range bytes.Split(bytes.TrimRight(files, "\x00"), []byte{0}) {
		if err := copyFile(filepath.Join(root, string(f)), filepath.Join(work, string(f))); err != nil {
			return "", err
		}
	}
	if shared, err := filepath.EvalSymlinks(filepath.Join(root, "..", "shared")); err == nil {
		if err := os.Symlink(shared, filepath.Join(scratch, "shared")); err != nil {
			return "", err
		}
	}
	return work, nil
}

// copyFile copies a regular file with its mode; one listed but gone (a
// deletion not yet committed) is skipped.
func copyFile(src, dst string) error {
	st, err := os.Lstat(src)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil || !st.Mode().IsRegular() {
		return err
	}
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	return os.WriteFile(dst, data, st.Mode().Perm())
}

// leftovers kills and names the processes whose working directory is in
// scratch: what a page started and did not stop. It sees them in /proc;
// where there is none, it sees none.
func leftovers(scratch string) []string {
	procs, _ := filepath.Glob("/proc/[0-9]*")
	var out []string
	for _, p := range procs {
		cwd, err := os.Readlink(filepath.Join(p, "cwd"))
		if err != nil || !strings.HasPrefix(cwd+"/", scratch+"/") {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join(p, "cmdline"))
		out = append(out, fmt.Sprintf("pid %s: %s", filepath.Base(p), bytes.ReplaceAll(bytes.TrimRight(cmdline, "\x00"), []byte{0}, []byte{' '})))
		var pid int
		fmt.Sscan(filepath.Base(p), &pid)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	return out
}
