package manager

import "testing"

func TestJoinLines(t *testing.T) {
	cases := []struct{ in, want string }{
		{"", ""},
		{"err\n", "err"},
		{"a\nb\n", "a\nb"},
		{"a\r\nb\rc\vd\fe\x1cf\u0085g\u2028h", "a\nb\nc\nd\ne\nf\ng\nh"},
		{"\n\n", "\n"},
		{"no newline", "no newline"},
		{"x\r", "x"},
	}
	for _, tc := range cases {
		if got := JoinLines(tc.in); got != tc.want {
			t.Errorf("JoinLines(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestDecodeUTF8ReplacesEachInvalidByte(t *testing.T) {
	cases := []struct{ in, want string }{
		{"plain", "plain"},
		{"a\xff\xfeb", "a\uFFFD\uFFFDb"},
		{"\xe2\x82", "\uFFFD"}, // truncated sequence: one, as Python
		{"\xe2\x82x", "\uFFFDx"},
		{"\xed\xa0\x80", "\uFFFD\uFFFD\uFFFD"}, // surrogate: each byte
		{"\xf0\x9f\x98", "\uFFFD"},
		{"\xc0\xaf", "\uFFFD\uFFFD"},
		{"€", "€"},
	}
	for _, tc := range cases {
		if got := DecodeUTF8([]byte(tc.in)); got != tc.want {
			t.Errorf("DecodeUTF8(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestQuantities(t *testing.T) {
	cpu := []struct {
		in   string
		want float64
		ok   bool
	}{{"4", 4, true}, {"500m", 0.5, true}, {"0.25", 0.25, true}, {"", 0, false}, {"-1", 0, false}, {"abc", 0, false}, {"NaN", 0, false}}
	for _, tc := range cpu {
		got, err := ParseCPU(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseCPU(%q) = %v, %v", tc.in, got, err)
		}
	}
	mem := []struct {
		in   string
		want int64
		ok   bool
	}{{"16Gi", 16 << 30, true}, {"512Mi", 512 << 20, true}, {"1G", 1e9, true}, {"1048576", 1 << 20, true}, {"2k", 2000, true},
		{"lots", 0, false}, {"0", 0, false}, {"1e30", 0, false}}
	for _, tc := range mem {
		got, err := ParseMemory(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseMemory(%q) = %v, %v", tc.in, got, err)
		}
	}
}

func TestValidID(t *testing.T) {
	for id, ok := range map[string]bool{"abc12345": true, "a": true, "sdk-seq": true, "Bad": false, "-a": false, "a-": false,
		"a_b": false, "": false, "x123456789012345678901234567890123456789012345678901234567890123": false} {
		if ValidID(id) != ok {
			t.Errorf("ValidID(%q) = %v", id, !ok)
		}
	}
}
