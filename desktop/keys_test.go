package desktop

import (
	"slices"
	"testing"

	"github.com/jezek/xgb/xproto"
)

func TestParseKeys(t *testing.T) {
	t.Parallel()
	const (
		ctrl  = ksControlL
		alt   = ksAltL
		shift = ksShiftL
		super = ksSuperL
	)
	for _, tc := range []struct {
		in   string
		want []chord
	}{
		{"ctrl+s", []chord{{ctrl, 's'}}},
		{"CTRL+S", []chord{{ctrl, 'S'}}}, // a lone capital means shift+s, as in xdotool
		{"Control+a", []chord{{ctrl, 'a'}}},
		{"Return", []chord{{ksReturn}}},
		{"return", []chord{{ksReturn}}},
		{"Enter", []chord{{ksReturn}}},
		{"super", []chord{{super}}},
		{"meta+l", []chord{{super, 'l'}}},
		{"cmd+c", []chord{{super, 'c'}}},
		{"Win", []chord{{super}}},
		{"shift+Tab", []chord{{shift, ksTab}}},
		{"ctrl+alt+Delete", []chord{{ctrl, alt, ksDelete}}},
		{"F5", []chord{{0xffc2}}},
		{"f12", []chord{{0xffc9}}},
		{"Page_Down", []chord{{0xff56}}},
		{"pagedown", []chord{{0xff56}}},
		{"Next", []chord{{0xff56}}},
		{"KP_Enter", []chord{{0xff8d}}},
		{"ArrowLeft", []chord{{0xff51}}},
		{"ctrl++", []chord{{ctrl, '+'}}},
		{"+", []chord{{'+'}}},
		{"ctrl+plus", []chord{{ctrl, '+'}}},
		{"Tab Tab Return", []chord{{ksTab}, {ksTab}, {ksReturn}}},
		{"alt+F4", []chord{{alt, 0xffc1}}},
		{"é", []chord{{0xe9}}},
		{"ctrl+✓", []chord{{ctrl, ksUnicode | 0x2713}}},
		{"XF86AudioMute", []chord{{0x1008ff12}}},
		{"space", []chord{{' '}}},
		{"Escape", []chord{{ksEscape}}},
		{"BackSpace", []chord{{ksBackSpace}}},
	} {
		got, err := parseKeys(tc.in)
		if err != nil {
			t.Errorf("parseKeys(%q): %v", tc.in, err)
			continue
		}
		if !slices.EqualFunc(got, tc.want, func(a, b chord) bool { return slices.Equal(a, b) }) {
			t.Errorf("parseKeys(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
	for _, bad := range []string{"", "   ", "ctrl+", "+ctrl", "ctrl++s", "ctrl+nosuchkey", "Hyperdrive", "F99", "ctrl+\x01"} {
		if got, err := parseKeys(bad); err == nil {
			t.Errorf("parseKeys(%q) = %v, want an error", bad, got)
		}
	}
}

func TestParseModifiers(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]chord{
		"":           nil,
		"shift":      {ksShiftL},
		"ctrl+alt":   {ksControlL, ksAltL},
		"ctrl shift": {ksControlL, ksShiftL},
		"SUPER":      {ksSuperL},
	} {
		got, err := parseModifiers(in)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("parseModifiers(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"a", "ctrl+a", "Return"} {
		if _, err := parseModifiers(bad); err == nil {
			t.Errorf("parseModifiers(%q): want an error", bad)
		}
	}
}

func TestRuneKeysym(t *testing.T) {
	t.Parallel()
	for r, want := range map[rune]xproto.Keysym{
		'a': 'a', 'Z': 'Z', ' ': ' ', '~': '~', 'é': 0xe9, 'ÿ': 0xff,
		'\n': ksReturn, '\t': ksTab, '✓': 0x1002713, '日': 0x10065e5, '€': 0x10020ac, '😀': 0x101f600,
	} {
		if got, ok := runeKeysym(r); !ok || got != want {
			t.Errorf("runeKeysym(%q) = %#x, %v; want %#x", r, got, ok, want)
		}
	}
	for _, r := range []rune{0, 0x07, 0x85} {
		if _, ok := runeKeysym(r); ok {
			t.Errorf("runeKeysym(%U): want not typeable", r)
		}
	}
}
