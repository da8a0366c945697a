package agent

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// A command such as `ls -l /tmp` needs no shell: `bash -c` parses it, finds
// no expansion to do and, as its last and only command, execs the program in
// its own process (bash's one-shot optimisation). The agent may then exec the
// program itself and save bash's start-up, which is most of an exec's cost:
// same process, same argv, and the environment bash would have built. This
// file decides when that is exactly equivalent and builds that environment;
// in every other case the command goes to bash.

// directCmd is a program started without bash, as bash -c would exec it.
type directCmd struct {
	path string   // what is passed to execve, relative to the command's directory
	argv []string // the command's words
	env  []string // the environment bash would give the program
}

const (
	// atEAccess is AT_EACCESS: bash checks the effective ids (eaccess), so
	// the agent does too.
	atEAccess = 0x200
	// probeTimeout bounds the one-time check of a bash binary; a healthy
	// bash answers in milliseconds.
	probeTimeout = 10 * time.Second
	// probeCommand prints the environment bash gives a program it execs
	// directly; cat is itself such a program, so what it prints is exactly
	// what the emulation must produce.
	probeCommand = "cat /proc/self/environ"
	// probeWords lists what bash runs itself rather than exec (builtins and
	// keywords): those commands never take the direct path.
	probeWords = "compgen -b; compgen -k"
)

// shellOwnedEnv are variables that bash reads at start-up or computes
// itself (`env -i bash -c 'compgen -v'`, plus the start-up files and
// options): an environment holding any of them goes to bash, since their
// effect (a sourced BASH_ENV, xtrace from SHELLOPTS, a value bash
// recomputes) is not reproduced here. PATH, PWD, OLDPWD, SHLVL and _ are
// reproduced; HOSTNAME, SHELL and TERM pass through bash unchanged.
var shellOwnedEnv = map[string]bool{
	"BASH": true, "BASHOPTS": true, "BASHPID": true, "BASH_ALIASES": true, "BASH_ARGC": true,
	"BASH_ARGV": true, "BASH_ARGV0": true, "BASH_CMDS": true, "BASH_COMMAND": true, "BASH_COMPAT": true,
	"BASH_ENV": true, "BASH_EXECUTION_STRING": true, "BASH_LINENO": true, "BASH_LOADABLES_PATH": true,
	"BASH_REMATCH": true, "BASH_SOURCE": true, "BASH_SUBSHELL": true, "BASH_VERSINFO": true,
	"BASH_VERSION": true, "BASH_XTRACEFD": true, "CDPATH": true, "COMP_WORDBREAKS": true, "DIRSTACK": true,
	"ENV": true, "EPOCHREALTIME": true, "EPOCHSECONDS": true, "EUID": true, "EXECIGNORE": true,
	"FUNCNAME": true, "GLOBIGNORE": true, "GROUPS": true, "HISTCMD": true, "HOSTTYPE": true, "IFS": true,
	"LINENO": true, "MACHTYPE": true, "OPTERR": true, "OPTIND": true, "OSTYPE": true, "PIPESTATUS": true,
	"POSIXLY_CORRECT": true, "PPID": true, "PS4": true, "RANDOM": true, "SECONDS": true,
	"SHELLOPTS": true, "SRANDOM": true, "UID": true,
}

// shellWords are bash 5.2's builtins and keywords (`bash -c 'compgen -b;
// compgen -k'`). A command starting with one runs in bash, whatever the
// probe of the actual bash says, so the common `echo`, `cd` or `true` skip
// the probe's PATH search altogether; the probe catches the builtins of
// other versions.
var shellWords = func() map[string]bool {
	m := make(map[string]bool)
	for _, w := range strings.Fields(`. : [ alias bg bind break builtin caller cd command compgen complete
		compopt continue declare dirs disown echo enable eval exec exit export false fc fg getopts hash
		help history jobs kill let local logout mapfile popd printf pushd pwd read readarray readonly
		return set shift shopt source suspend test times trap true type typeset ulimit umask unalias
		unset wait if then else elif fi case esac for select while until do done in function time
		{ } ! [[ ]] coproc`) {
		m[w] = true
	}
	return m
}()

// maxShellLevel is the highest SHLVL bash passes on unchanged: it raises the
// level at start-up, lowers it again before a one-shot exec, and warns and
// resets at 1000.
const maxShellLevel = 998

// simpleWords splits cmd into its words when it is a plain command that bash
// would run without any expansion: words of safe characters separated by
// blanks, the first not an assignment or job spec.
func simpleWords(cmd string) ([]string, bool) {
	words := strings.FieldsFunc(cmd, func(r rune) bool { return r == ' ' || r == '\t' })
	if len(words) == 0 {
		return nil, false
	}
	for _, w := range words {
		for i := 0; i < len(w); i++ {
			if !safeByte(w[i]) {
				return nil, false
			}
		}
	}
	if strings.ContainsAny(words[0], "=%") {
		return nil, false
	}
	return words, true
}

// safeByte reports whether c means nothing to bash inside a word: no quote,
// expansion, glob, tilde, redirection, separator, comment or escape.
func safeByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("_./-=:,+@%", c) >= 0
}

// bashFacts is what the agent learnt about one bash binary.
type bashFacts struct {
	direct bool            // its one-shot environment is the one oneShotEnv builds
	words  map[string]bool // its builtins and keywords
}

// bashProbes caches bashFacts per bash binary: the check costs two bash
// runs, once per binary for the life of the agent.
type bashProbes struct {
	mu    sync.Mutex // guards facts; held during a probe so that it runs once
	facts map[bashKey]bashFacts
}

// bashKey names a bash binary; the inode and mtime catch a replaced one.
type bashKey struct {
	path  string
	ino   uint64
	mtime int64
}

// directCommand returns how to run cmd without bash, or nil when bash must
// run it. env and dir are the command's; bash is the one the exec would
// start.
func (s *Server) directCommand(ctx context.Context, cmd string, env []string, dir string) *directCmd {
	words, ok := simpleWords(cmd)
	if !ok || shellWords[words[0]] || !filepath.IsAbs(dir) {
		return nil
	}
	bash, err := lookPath("bash", env, dir)
	if err != nil {
		return nil // the exec reports the missing bash as it always did
	}
	facts := s.bashes.get(ctx, s, bash)
	if !facts.direct || facts.words[words[0]] {
		return nil
	}
	path, underscore, ok := resolveProgram(words[0], env, dir)
	if !ok {
		return nil // bash says "not found" or "Permission denied" its own way
	}
	childEnv, ok := oneShotEnv(env, dir, underscore)
	if !ok {
		return nil
	}
	return &directCmd{path: path, argv: words, env: childEnv}
}

// get returns the facts of the bash at path, probing it on first use. A
// probe that fails for any reason leaves that bash on the bash path.
func (p *bashProbes) get(ctx context.Context, s *Server, path string) bashFacts {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return bashFacts{}
	}
	key := bashKey{path: path, ino: st.Ino, mtime: st.Mtim.Nano()}
	p.mu.Lock()
	defer p.mu.Unlock()
	if f, ok := p.facts[key]; ok {
		return f
	}
	f := s.probeBash(ctx, path)
	if p.facts == nil {
		p.facts = make(map[bashKey]bashFacts)
	}
	p.facts[key] = f
	return f
}

// probeBash runs the bash at path twice: once to list what it runs itself,
// once to compare the environment it gives a program it execs against
// oneShotEnv's. The probe environment covers each rule: SHLVL and PWD to be
// created, an OLDPWD to be dropped, an imported _ and names that share a
// hash bucket.
func (s *Server) probeBash(ctx context.Context, path string) bashFacts {
	// A request that goes away must not leave the bash unprobed for good.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), probeTimeout)
	defer cancel()
	const dir = "/"
	env := []string{"PATH=" + filepath.Dir(path) + ":/usr/bin:/bin", "OLDPWD=/nonexistent/orchard",
		"BKA=1", "CLM=2", "_=x", "DEI=3", "HOME=/"}
	run := func(cmd string) (string, bool) {
		var out []byte
		exit, err := s.run(ctx, runSpec{argv: []string{path, "-c", cmd}, dir: dir, env: env, timeout: probeTimeout,
			maxOutput: 1 << 20}, func(stream string, p []byte) {
			if stream == streamStdout {
				out = append(out, p...)
			}
		})
		return string(out), err == nil && exit.ExitCode == 0
	}
	words, ok := run(probeWords)
	if !ok {
		s.log.Info("bash probe failed: commands keep going through bash", "bash", path)
		return bashFacts{}
	}
	facts := bashFacts{words: make(map[string]bool)}
	for _, w := range strings.Fields(words) {
		facts.words[w] = true
	}
	cat, underscore, ok := resolveProgram("cat", env, dir)
	if !ok || cat == "" {
		return bashFacts{}
	}
	want, ok := oneShotEnv(env, dir, underscore)
	got, ran := run(probeCommand)
	if !ok || !ran {
		return bashFacts{}
	}
	facts.direct = slices.Equal(strings.Split(strings.TrimSuffix(got, "\x00"), "\x00"), want)
	if !facts.direct {
		s.log.Info("bash builds environments differently: commands keep going through bash", "bash", path)
	}
	return facts
}

// resolveProgram finds the program bash would exec for word: a word with a
// slash as it is, otherwise the first executable non-directory along PATH.
// It also returns the value bash gives $_ (the path as bash built it). It
// fails, leaving the command to bash, when bash would not find an
// executable, when PATH is unset (bash then searches its own default), or
// when the search meets a relative or empty PATH entry (bash expands ~ and
// resolves those against its own state).
func resolveProgram(word string, env []string, dir string) (path, underscore string, ok bool) {
	if strings.Contains(word, "/") {
		p := word
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if !canExec(p) {
			return "", "", false
		}
		// execve gets the word as written, relative to the command's
		// directory: a script's interpreter sees that name as $0.
		return word, word, true
	}
	pathEnv, set := envValue(env, "PATH")
	if !set {
		return "", "", false
	}
	for _, d := range strings.Split(pathEnv, ":") {
		if !filepath.IsAbs(d) {
			return "", "", false
		}
		full := d + "/" + word
		if strings.HasSuffix(d, "/") {
			full = d + word
		}
		if canExec(full) {
			return full, full, true
		}
	}
	return "", "", false
}

// canExec is bash's test for a command it may run: not a directory, and
// executable for the effective ids.
func canExec(p string) bool {
	fi, err := os.Stat(p)
	if err != nil || fi.IsDir() {
		return false
	}
	return syscall.Faccessat(atFDCWD, p, 1, atEAccess) == nil
}

// atFDCWD is AT_FDCWD.
const atFDCWD = -100

// oneShotEnv is the environment bash -c gives a program it execs directly
// in dir, with $_ set to underscore. bash imports the environment into a
// hash table of 1024 buckets (FNV-1 of the name; a new name goes to the
// head of its bucket) and exports it back bucket by bucket; on the way it
// sets PWD, SHLVL and _ and drops an OLDPWD that is not a directory. It
// fails for an environment bash would treat otherwise: exported functions,
// variables bash owns, names that are not identifiers, duplicates, an
// unusual SHLVL.
func oneShotEnv(env []string, dir, underscore string) ([]string, bool) {
	type variable struct {
		name, value string
		drop        bool
	}
	vars := make([]variable, 0, len(env)+3)
	index := make(map[string]int, len(env))
	for _, kv := range env {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || !isIdentifier(name) || shellOwnedEnv[name] || strings.HasPrefix(name, "BASH_FUNC_") {
			return nil, false
		}
		if _, dup := index[name]; dup {
			return nil, false
		}
		index[name] = len(vars)
		vars = append(vars, variable{name: name, value: value})
	}

	// PWD: an inherited absolute PWD naming the directory is kept as
	// written (symlinks and all); otherwise bash asks getcwd, which
	// reports the physical path.
	if i, ok := index["PWD"]; !ok || !samePWD(vars[i].value, dir) {
		cwd, err := filepath.EvalSymlinks(dir)
		if err != nil {
			return nil, false
		}
		if ok {
			vars[i].value = cwd
		} else {
			index["PWD"] = len(vars)
			vars = append(vars, variable{name: "PWD", value: cwd})
		}
	}
	if i, ok := index["OLDPWD"]; ok {
		p := vars[i].value
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if fi, err := os.Stat(p); err != nil || !fi.IsDir() {
			vars[i].drop = true
		}
	}
	if i, ok := index["SHLVL"]; ok {
		n, err := strconv.Atoi(vars[i].value)
		if err != nil || n < 0 || n > maxShellLevel || strconv.Itoa(n) != vars[i].value {
			return nil, false
		}
	} else {
		index["SHLVL"] = len(vars)
		vars = append(vars, variable{name: "SHLVL", value: "0"})
	}
	_, importedUnderscore := index["_"]
	if importedUnderscore {
		vars[index["_"]].value = underscore
	}

	order := make([]int, len(vars))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		ba, bb := bashBucket(vars[a].name), bashBucket(vars[b].name)
		if ba != bb {
			return int(ba) - int(bb)
		}
		return b - a // later insertions come first in a bucket
	})
	out := make([]string, 0, len(vars)+1)
	for _, i := range order {
		if !vars[i].drop {
			out = append(out, vars[i].name+"="+vars[i].value)
		}
	}
	if !importedUnderscore {
		out = append(out, "_="+underscore)
	}
	return out, true
}

// samePWD is bash's test for keeping an inherited PWD: absolute, and the
// same file as the directory it starts in.
func samePWD(pwd, dir string) bool {
	if !filepath.IsAbs(pwd) {
		return false
	}
	var a, b syscall.Stat_t
	if syscall.Stat(pwd, &a) != nil || syscall.Stat(dir, &b) != nil {
		return false
	}
	return a.Dev == b.Dev && a.Ino == b.Ino
}

// bashBucket is the bucket of name in bash's variable table: FNV-1, 32 bits,
// masked to 1024 buckets.
func bashBucket(name string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(name); i++ {
		h *= 16777619
		h ^= uint32(name[i])
	}
	return h & 1023
}

// isIdentifier is bash's legal_identifier: bash keeps other names apart and
// exports them in an order of their own.
func isIdentifier(name string) bool {
	if name == "" || ('0' <= name[0] && name[0] <= '9') {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9') {
			return false
		}
	}
	return true
}
