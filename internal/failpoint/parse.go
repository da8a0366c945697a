package failpoint

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/orchard/orchard/faults"
)

// Parse reads a value of ORCHARD_FAILPOINTS (grammar in the package doc)
// into actions by point name. The empty string enables nothing.
func Parse(spec string) (map[string]Action, error) {
	acts := map[string]Action{}
	for i, entry := range strings.Split(spec, ";") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		name, a, err := parseEntry(entry)
		if err != nil {
			return nil, fmt.Errorf("parse failpoints: entry %d %q: %w", i+1, entry, err)
		}
		if _, dup := acts[name]; dup {
			return nil, fmt.Errorf("parse failpoints: entry %d %q: point %s is given twice", i+1, entry, name)
		}
		acts[name] = a
	}
	return acts, nil
}

func parseEntry(entry string) (string, Action, error) {
	name, act, ok := strings.Cut(entry, "=")
	if !ok {
		return "", Action{}, errors.New(`want name=action`)
	}
	name, act = strings.TrimSpace(name), strings.TrimSpace(act)
	if err := checkName(name); err != nil {
		return "", Action{}, err
	}
	times := 0
	if star := strings.IndexByte(act, '*'); star >= 0 && (strings.IndexByte(act, '(') < 0 || star < strings.IndexByte(act, '(')) {
		n, err := strconv.Atoi(strings.TrimSpace(act[:star]))
		if err != nil || n < 1 {
			return "", Action{}, fmt.Errorf("count %q: want a positive integer", strings.TrimSpace(act[:star]))
		}
		times, act = n, strings.TrimSpace(act[star+1:])
	}
	a, err := parseAction(name, act)
	if err != nil {
		return "", Action{}, err
	}
	if times > 0 {
		a = a.Times(times)
	}
	return name, a, nil
}

func parseAction(name, act string) (Action, error) {
	fn, arg, hasArg := strings.Cut(act, "(")
	fn = strings.TrimSpace(fn)
	if hasArg {
		var closed bool
		if arg, closed = strings.CutSuffix(arg, ")"); !closed {
			return Action{}, fmt.Errorf("action %q: missing closing parenthesis", act)
		}
		arg = strings.TrimSpace(arg)
	}
	switch fn {
	case "error":
		if arg == "" {
			return Action{}, errors.New("error needs a fault code: error(site.http_503)")
		}
		info, ok := faults.Lookup(arg)
		if !ok {
			return Action{}, fmt.Errorf("error(%s): no such fault code (the codes are listed in docs/faults.md)", arg)
		}
		e := faults.New(info.Code, info.Category, info.Source, "injected by failpoint "+name).WithRetryable(info.Retryable)
		return Return(e), nil
	case "sleep":
		if arg == "" {
			return Action{}, errors.New("sleep needs a duration: sleep(200ms)")
		}
		d, err := time.ParseDuration(arg)
		if err != nil {
			return Action{}, fmt.Errorf("sleep(%s): %w", arg, err)
		}
		if d < 0 {
			return Action{}, fmt.Errorf("sleep(%s): negative duration", arg)
		}
		return Sleep(d), nil
	case "panic":
		if arg != "" {
			return Action{}, fmt.Errorf("panic takes no argument, got %q", arg)
		}
		return Panic(), nil
	}
	return Action{}, fmt.Errorf("unknown action %q: want error(code), sleep(duration) or panic", act)
}

// checkName accepts the names the grammar can express.
func checkName(name string) error {
	if name == "" {
		return errors.New("empty point name")
	}
	for _, r := range name {
		switch {
		case 'a' <= r && r <= 'z', 'A' <= r && r <= 'Z', '0' <= r && r <= '9', r == '.', r == '_', r == '-', r == '/':
		default:
			return fmt.Errorf("point name %q: want letters, digits, \".\", \"_\", \"-\" or \"/\"", name)
		}
	}
	return nil
}
