package egress

import (
	"iter"
	"strings"
)

func splitComma(s string) iter.Seq[string] {
	return func(yield func(string) bool) {
		for f := range strings.SplitSeq(s, ",") {
			if f = strings.TrimSpace(f); f != "" && !yield(f) {
				return
			}
		}
	}
}

func cutEq(s string) (string, string, bool) {
	a, b, ok := strings.Cut(s, "=")
	a, b = strings.TrimSpace(a), strings.TrimSpace(b)
	return a, b, ok && a != "" && b != ""
}
