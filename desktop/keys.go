package desktop

import (
	"fmt"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/jezek/xgb/xproto"
)

// Keysyms this package presses by value.
const (
	ksNoSymbol  xproto.Keysym = 0
	ksBackSpace xproto.Keysym = 0xff08
	ksTab       xproto.Keysym = 0xff09
	ksReturn    xproto.Keysym = 0xff0d
	ksEscape    xproto.Keysym = 0xff1b
	ksDelete    xproto.Keysym = 0xffff
	ksShiftL    xproto.Keysym = 0xffe1
	ksShiftR    xproto.Keysym = 0xffe2
	ksControlL  xproto.Keysym = 0xffe3
	ksControlR  xproto.Keysym = 0xffe4
	ksMetaL     xproto.Keysym = 0xffe7
	ksMetaR     xproto.Keysym = 0xffe8
	ksAltL      xproto.Keysym = 0xffe9
	ksAltR      xproto.Keysym = 0xffea
	ksSuperL    xproto.Keysym = 0xffeb
	ksSuperR    xproto.Keysym = 0xffec
	ksHyperL    xproto.Keysym = 0xffed
	ksHyperR    xproto.Keysym = 0xffee
	ksISOLevel3 xproto.Keysym = 0xfe03
	ksModeSw    xproto.Keysym = 0xff7e
	// ksUnicode marks a keysym that carries a Unicode code point in its low
	// 24 bits, the encoding X uses for characters without a legacy keysym.
	ksUnicode xproto.Keysym = 0x01000000
)

// keysymNames maps X keysym names, as xdotool and the X headers spell them,
// to their values. Lookups go through normKeyName, so "Page_Down",
// "page_down" and "PageDown" all match "Page_Down".
var keysymNames = map[string]xproto.Keysym{
	"BackSpace": 0xff08, "Tab": 0xff09, "Linefeed": 0xff0a, "Clear": 0xff0b,
	"Return": 0xff0d, "Pause": 0xff13, "Scroll_Lock": 0xff14, "Sys_Req": 0xff15,
	"Escape": 0xff1b, "Delete": 0xffff, "Multi_key": 0xff20,
	"Home": 0xff50, "Left": 0xff51, "Up": 0xff52, "Right": 0xff53, "Down": 0xff54,
	"Prior": 0xff55, "Page_Up": 0xff55, "Next": 0xff56, "Page_Down": 0xff56,
	"End": 0xff57, "Begin": 0xff58, "Select": 0xff60, "Print": 0xff61,
	"Execute": 0xff62, "Insert": 0xff63, "Undo": 0xff65, "Redo": 0xff66,
	"Menu": 0xff67, "Find": 0xff68, "Cancel": 0xff69, "Help": 0xff6a,
	"Break": 0xff6b, "Mode_switch": 0xff7e, "Num_Lock": 0xff7f,
	"ISO_Left_Tab": 0xfe20, "ISO_Level3_Shift": 0xfe03,

	"KP_Space": 0xff80, "KP_Tab": 0xff89, "KP_Enter": 0xff8d,
	"KP_F1": 0xff91, "KP_F2": 0xff92, "KP_F3": 0xff93, "KP_F4": 0xff94,
	"KP_Home": 0xff95, "KP_Left": 0xff96, "KP_Up": 0xff97, "KP_Right": 0xff98,
	"KP_Down": 0xff99, "KP_Prior": 0xff9a, "KP_Page_Up": 0xff9a, "KP_Next": 0xff9b,
	"KP_Page_Down": 0xff9b, "KP_End": 0xff9c, "KP_Begin": 0xff9d,
	"KP_Insert": 0xff9e, "KP_Delete": 0xff9f, "KP_Equal": 0xffbd,
	"KP_Multiply": 0xffaa, "KP_Add": 0xffab, "KP_Separator": 0xffac,
	"KP_Subtract": 0xffad, "KP_Decimal": 0xffae, "KP_Divide": 0xffaf,
	"KP_0": 0xffb0, "KP_1": 0xffb1, "KP_2": 0xffb2, "KP_3": 0xffb3, "KP_4": 0xffb4,
	"KP_5": 0xffb5, "KP_6": 0xffb6, "KP_7": 0xffb7, "KP_8": 0xffb8, "KP_9": 0xffb9,

	"Shift_L": ksShiftL, "Shift_R": ksShiftR, "Control_L": ksControlL,
	"Control_R": ksControlR, "Caps_Lock": 0xffe5, "Shift_Lock": 0xffe6,
	"Meta_L": ksMetaL, "Meta_R": ksMetaR, "Alt_L": ksAltL, "Alt_R": ksAltR,
	"Super_L": ksSuperL, "Super_R": ksSuperR, "Hyper_L": ksHyperL, "Hyper_R": ksHyperR,

	"space": 0x20, "exclam": 0x21, "quotedbl": 0x22, "numbersign": 0x23,
	"dollar": 0x24, "percent": 0x25, "ampersand": 0x26, "apostrophe": 0x27,
	"quoteright": 0x27, "parenleft": 0x28, "parenright": 0x29, "asterisk": 0x2a,
	"plus": 0x2b, "comma": 0x2c, "minus": 0x2d, "period": 0x2e, "slash": 0x2f,
	"colon": 0x3a, "semicolon": 0x3b, "less": 0x3c, "equal": 0x3d,
	"greater": 0x3e, "question": 0x3f, "at": 0x40, "bracketleft": 0x5b,
	"backslash": 0x5c, "bracketright": 0x5d, "asciicircum": 0x5e,
	"underscore": 0x5f, "grave": 0x60, "quoteleft": 0x60, "braceleft": 0x7b,
	"bar": 0x7c, "braceright": 0x7d, "asciitilde": 0x7e,

	"XF86AudioLowerVolume": 0x1008ff11, "XF86AudioMute": 0x1008ff12,
	"XF86AudioRaiseVolume": 0x1008ff13, "XF86AudioPlay": 0x1008ff14,
	"XF86AudioStop": 0x1008ff15, "XF86AudioPrev": 0x1008ff16,
	"XF86AudioNext": 0x1008ff17, "XF86HomePage": 0x1008ff18, "XF86Mail": 0x1008ff19,
	"XF86Search": 0x1008ff1b, "XF86Calculator": 0x1008ff1d, "XF86Back": 0x1008ff26,
	"XF86Forward": 0x1008ff27, "XF86Refresh": 0x1008ff29, "XF86Copy": 0x1008ff57,
	"XF86Cut": 0x1008ff58, "XF86Paste": 0x1008ff6d,
}

// keyAliases are the other spellings agents use: modifier names (xdotool's
// and the computer-use APIs'), browser-style names ("ArrowLeft", "Enter")
// and common abbreviations. Keys are already normalised (normKeyName).
var keyAliases = map[string]xproto.Keysym{
	"ctrl": ksControlL, "control": ksControlL, "lctrl": ksControlL, "rctrl": ksControlR,
	"alt": ksAltL, "option": ksAltL, "lalt": ksAltL, "ralt": ksAltR, "altgr": ksISOLevel3,
	"shift": ksShiftL, "lshift": ksShiftL, "rshift": ksShiftR,
	"super": ksSuperL, "meta": ksSuperL, "cmd": ksSuperL, "command": ksSuperL,
	"win": ksSuperL, "windows": ksSuperL, "os": ksSuperL,
	"enter": 0xff0d, "ret": 0xff0d, "esc": 0xff1b, "del": 0xffff, "ins": 0xff63,
	"backspace": 0xff08, "bksp": 0xff08,
	"arrowup": 0xff52, "arrowdown": 0xff54, "arrowleft": 0xff51, "arrowright": 0xff53,
	"pageup": 0xff55, "pgup": 0xff55, "pagedown": 0xff56, "pgdn": 0xff56,
	"capslock": 0xffe5, "numlock": 0xff7f, "scrolllock": 0xff14,
	"printscreen": 0xff61, "prtsc": 0xff61, "contextmenu": 0xff67, "apps": 0xff67,
	"spacebar": 0x20, "dot": 0x2e, "quote": 0x27, "doublequote": 0x22,
	"backquote": 0x60, "backtick": 0x60, "tilde": 0x7e, "equals": 0x3d,
	"hash": 0x23, "pipe": 0x7c, "caret": 0x5e,
	"volumeup": 0x1008ff13, "volumedown": 0x1008ff11, "volumemute": 0x1008ff12,
	"browserback": 0x1008ff26, "browserforward": 0x1008ff27, "browserrefresh": 0x1008ff29,
}

// keyIndex is keysymNames and keyAliases under their normalised names,
// plus F1–F35. It and canonicalNames are built on first use, not at
// start-up: every sandbox's agent links this package, and most never
// press a key.
var keyIndex = sync.OnceValue(func() map[string]xproto.Keysym {
	m := make(map[string]xproto.Keysym, len(keysymNames)+len(keyAliases)+35)
	for name, ks := range keysymNames {
		m[normKeyName(name)] = ks
	}
	for name, ks := range keyAliases {
		m[name] = ks
	}
	for i := 1; i <= 35; i++ {
		m[fmt.Sprintf("f%d", i)] = 0xffbe + xproto.Keysym(i-1)
	}
	return m
})

// normKeyName folds case and drops '_' and '-', so the spellings of one
// key name agree.
func normKeyName(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '_' || r == '-' {
			return -1
		}
		return unicode.ToLower(r)
	}, s)
}

// keysymOf resolves one key name. A single character stands for itself
// and keeps its case, as in xdotool ("A" is shift+a); longer names are
// case-insensitive.
func keysymOf(name string) (xproto.Keysym, bool) {
	if utf8.RuneCountInString(name) == 1 {
		r, _ := utf8.DecodeRuneInString(name)
		return runeKeysym(r)
	}
	ks, ok := keyIndex()[normKeyName(name)]
	return ks, ok
}

// runeKeysym is the keysym that types r: Latin-1 characters are their own
// keysyms, a few control characters have named keys, everything else uses
// the Unicode keysym range.
func runeKeysym(r rune) (xproto.Keysym, bool) {
	switch {
	case r == '\n' || r == '\r':
		return ksReturn, true
	case r == '\t':
		return ksTab, true
	case r == '\b':
		return ksBackSpace, true
	case r == 0x1b:
		return ksEscape, true
	case r == 0x7f:
		return ksDelete, true
	case r >= 0x20 && r <= 0x7e, r >= 0xa0 && r <= 0xff:
		return xproto.Keysym(r), true
	case r < 0x20, r >= 0x80 && r < 0xa0, r == utf8.RuneError, r > unicode.MaxRune:
		return 0, false
	}
	return ksUnicode | xproto.Keysym(r), true
}

// isModifier reports the keysyms a chord may hold while clicking or
// scrolling.
func isModifier(ks xproto.Keysym) bool {
	switch ks {
	case ksShiftL, ksShiftR, ksControlL, ksControlR, ksMetaL, ksMetaR, ksAltL, ksAltR,
		ksSuperL, ksSuperR, ksHyperL, ksHyperR, ksISOLevel3, ksModeSw:
		return true
	}
	return false
}

// chord is keys pressed together, in order, and released in reverse.
type chord []xproto.Keysym

// parseKeys reads xdotool-style key input: chords separated by
// whitespace ("ctrl+shift+t", "Tab Tab Return"), keys within a chord
// joined by '+'. "+" alone and a trailing "++" ("ctrl++") name the plus
// key itself.
func parseKeys(s string) ([]chord, error) {
	fields := strings.Fields(s)
	if len(fields) == 0 {
		return nil, fmt.Errorf("no keys given")
	}
	out := make([]chord, 0, len(fields))
	for _, f := range fields {
		c, err := parseChord(f)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

func parseChord(s string) (chord, error) {
	var names []string
	switch {
	case s == "+":
		names = []string{"+"}
	case strings.HasSuffix(s, "++"):
		names = append(strings.Split(s[:len(s)-2], "+"), "+")
	default:
		names = strings.Split(s, "+")
	}
	c := make(chord, 0, len(names))
	for _, n := range names {
		if n == "" {
			return nil, fmt.Errorf("key chord %q: empty key name", s)
		}
		ks, ok := keysymOf(n)
		if !ok {
			return nil, fmt.Errorf("key chord %q: unknown key %q", s, n)
		}
		c = append(c, ks)
	}
	return c, nil
}

// parseModifiers reads the keys to hold during a mouse action ("shift",
// "ctrl+alt"; '+' or whitespace between them). Every key must be a
// modifier.
func parseModifiers(s string) (chord, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	var c chord
	for _, n := range strings.FieldsFunc(s, func(r rune) bool { return r == '+' || unicode.IsSpace(r) }) {
		ks, ok := keysymOf(n)
		if !ok || !isModifier(ks) {
			return nil, fmt.Errorf("modifiers %q: %q is not a modifier key (shift, ctrl, alt, super)", s, n)
		}
		c = append(c, ks)
	}
	return c, nil
}

// keyName is the canonical name of a keysym, for chords rebuilt from
// other dialects: the X name where there is one, else the character.
func keyName(ks xproto.Keysym) string {
	if n, ok := canonicalNames()[ks]; ok {
		return n
	}
	if ks&0xff000000 == ksUnicode {
		return string(rune(ks &^ ksUnicode))
	}
	if ks < 0x100 {
		return string(rune(ks))
	}
	return fmt.Sprintf("0x%x", uint32(ks))
}

// canonicalNames maps the keysyms of keysymNames back to one name each,
// preferring the modern spelling (Page_Up over Prior).
var canonicalNames = sync.OnceValue(func() map[xproto.Keysym]string {
	m := make(map[xproto.Keysym]string, len(keysymNames))
	for name, ks := range keysymNames {
		if ks < 0x100 {
			continue // printable ASCII/Latin-1: the character itself is clearer
		}
		if old, ok := m[ks]; !ok || preferName(name, old) {
			m[ks] = name
		}
	}
	for i := 1; i <= 35; i++ {
		m[0xffbe+xproto.Keysym(i-1)] = fmt.Sprintf("F%d", i)
	}
	m[ksControlL], m[ksAltL], m[ksShiftL], m[ksSuperL] = "ctrl", "alt", "shift", "super"
	m[0x20] = "space"
	return m
})

func preferName(a, b string) bool {
	switch {
	case strings.Contains(a, "Page") != strings.Contains(b, "Page"):
		return strings.Contains(a, "Page")
	case len(a) != len(b):
		return len(a) < len(b)
	}
	return a < b
}
