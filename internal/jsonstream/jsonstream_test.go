package jsonstream

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
	"unicode/utf8"

	"github.com/orchard/orchard/internal/testing/testenv"
)

// read runs a Reader that streams "content" and keeps "path" and "mode",
// as the upload handlers do, and returns the streamed bytes.
func read(t testing.TB, in io.Reader) (Result, []byte, error) {
	t.Helper()
	var got []byte
	calls := 0
	r := Reader{Stream: "content", Keep: []string{"path", "mode"}, MaxValue: 1 << 10,
		OnStream: func(_ []Member, content io.Reader) error {
			calls++
			b, err := io.ReadAll(content)
			got = b
			return err
		}}
	res, err := r.Read(in)
	if calls > 1 {
		t.Fatalf("OnStream called %d times", calls)
	}
	return res, got, err
}

// agrees checks Read against encoding/json on one input: the same verdict
// on validity, the same content string and the same kept values.
func agrees(t *testing.T, in []byte) {
	t.Helper()
	for _, src := range []struct {
		name string
		r    io.Reader
	}{{"whole", bytes.NewReader(in)}, {"one byte at a time", iotest.OneByteReader(bytes.NewReader(in))}} {
		res, content, err := read(t, src.r)
		var se *SyntaxError
		if err != nil && !errors.As(err, &se) {
			t.Fatalf("%s: %q: not a syntax error: %v", src.name, in, err)
		}
		valid := json.Valid(in)
		blank := len(bytes.Trim(in, " \t\r\n")) == 0 // JSON's whitespace, not Unicode's
		switch {
		case blank:
			if err != nil || res.Kind != 0 {
				t.Fatalf("%s: %q: blank input gave %+v, %v", src.name, in, res, err)
			}
			continue
		case valid != (err == nil):
			t.Fatalf("%s: %q: json.Valid = %v, Read error = %v", src.name, in, valid, err)
		case !valid:
			continue
		}
		if res.Size != int64(len(in)) {
			t.Fatalf("%s: %q: Size %d, want %d", src.name, in, res.Size, len(in))
		}
		var top any
		_ = json.Unmarshal(in, &top)
		obj, isObj := top.(map[string]any)
		if isObj != (res.Kind == Object) {
			t.Fatalf("%s: %q: Kind %c", src.name, in, res.Kind)
		}
		if !isObj || res.Duplicate != "" {
			continue
		}
		var raw map[string]json.RawMessage
		_ = json.Unmarshal(in, &raw)
		for _, m := range res.Members {
			want, ok := raw[m.Name]
			if !ok {
				continue // a name that differs in case: maps match exactly
			}
			switch {
			case m.Kind == String && strings.EqualFold(m.Name, "content"):
				var s string
				_ = json.Unmarshal(want, &s)
				// encoding/json turns invalid UTF-8 into U+FFFD; the
				// stream passes bytes on as they are.
				if utf8.Valid(content) && s != string(content) {
					t.Fatalf("%s: %q: streamed %q, want %q", src.name, in, content, s)
				}
			case m.TooLong:
			case !bytes.Equal(m.Value, want):
				t.Fatalf("%s: %q: member %s = %s, want %s", src.name, in, m.Name, m.Value, want)
			}
		}
		_ = obj
	}
}

var corpus = []string{
	``, ` `, " \t\r\n",
	`{}`, ` { } `, `[]`, `"s"`, `0`, `-0`, `1.5e+3`, `true`, `false`, `null`,
	`{"path":"/a","content":"aGk="}`,
	`{"content":"aGk=","path":"/a","mode":"0755"}`,
	`{"path":"/a","content":"aGk=","mode":null}`,
	`{"Path":"/a","CONTENT":"aGk="}`,
	`{"path":"/a","content":"a\u0047k\/\n\r\t\b\f\"\\="}`,
	`{"content":"\ud83d\ude00 \ud83d \ude00 \ud83dx \ud83d\u0041"}`,
	`{"content":"` + "\xff\xfe" + `"}`,
	`{"path":5,"content":[1,{"a":[]}],"mode":{"x":true}}`,
	`{"other":{"deep":[[[["content"]]]]},"content":""}`,
	`{"p\u0061th":"/esc","content":""}`,
	`{"path":"/a","content":"x","content":"y"}`,
	`{"path":"/a","content":"` + strings.Repeat("QUJD", 5000) + `"}`,
	`{"path":"` + strings.Repeat("p", 2000) + `","content":""}`,
	`{"` + strings.Repeat("n", 300) + `":1,"content":"x"}`,
	`{"a":-1.0E-2,"b":0.5,"c":-0,"d":1e9}`,
	// Invalid.
	`{`, `}`, `{"path"`, `{"path":}`, `{"path":"/a",}`, `{"path":"/a"} x`, `{"path":"/a"}{}`,
	`{"content":"abc`, `{"content":"a\`, `{"content":"\x"}`, `{"content":"\u12"}`, `{"content":"\u12g4"}`,
	"{\"content\":\"a\nb\"}", "{\"content\":\"a\x00b\"}",
	`{"a":01}`, `{"a":1.}`, `{"a":-}`, `{"a":1e}`, `{"a":.5}`, `{"a":+1}`, `{"a":tru}`, `{"a":nul}`, `{"a":falsey}`,
	`{"a" 1}`, `{1:2}`, `{"a":[1,]}`, `{"a":[1 2]}`, `{"a":{"b"}}`, `[1,2`, `"abc`, `nul`, `-`, `01`, `1 2`,
	`{"path":"/a","content":"aGk="}` + "\x00",
	"\xef\xbb\xbf{}",
}

func TestReadAgreesWithEncodingJSON(t *testing.T) {
	for _, in := range corpus {
		agrees(t, []byte(in))
	}
	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	for _, n := range []int{9999, 10000, 10001} {
		agrees(t, []byte(deep(n)))
		agrees(t, []byte(`{"a":`+deep(n-1)+`}`))
		agrees(t, []byte(`{"a":`+deep(n)+`}`))
	}
}

func FuzzRead(f *testing.F) {
	for _, in := range corpus {
		f.Add([]byte(in))
	}
	f.Fuzz(func(t *testing.T, in []byte) { agrees(t, in) })
}

func TestMembers(t *testing.T) {
	in := `{"x":[1],"path":"/a\/b","content":"aGk=","mode":5,"content":"again","y":"z"}`
	var before []Member
	r := Reader{Stream: "content", Keep: []string{"path", "mode"}, MaxValue: 64,
		OnStream: func(b []Member, content io.Reader) error {
			before = append([]Member(nil), b...)
			return nil // leaves the content unread: Read drops it
		}}
	res, err := r.Read(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(before) != 1 || before[0].Name != "path" || string(before[0].Value) != `"/a\/b"` {
		t.Fatalf("before the content: %+v", before)
	}
	want := []Member{{Name: "path", Kind: String, Value: []byte(`"/a\/b"`)}, {Name: "content", Kind: String}, {Name: "mode", Kind: Number, Value: []byte("5")}}
	if len(res.Members) != len(want) {
		t.Fatalf("members %+v", res.Members)
	}
	for i, m := range res.Members {
		if m.Name != want[i].Name || m.Kind != want[i].Kind || !bytes.Equal(m.Value, want[i].Value) {
			t.Fatalf("member %d = %+v, want %+v", i, m, want[i])
		}
	}
	if res.Duplicate != "content" {
		t.Fatalf("Duplicate = %q", res.Duplicate)
	}
	if p, ok := StringMember(res.Members, "PATH"); !ok || p != "/a/b" {
		t.Fatalf("StringMember(path) = %q, %v", p, ok)
	}
	if _, ok := StringMember(res.Members, "mode"); ok {
		t.Fatal("StringMember(mode) found a string in a number")
	}

	res, err = r.Read(strings.NewReader(`{"path":"` + strings.Repeat("x", 100) + `","content":{"a":1}}`))
	if err != nil {
		t.Fatal(err)
	}
	if m := res.Members[0]; !m.TooLong || m.Value != nil || m.Kind != String {
		t.Fatalf("a long path: %+v", m)
	}
	if m := res.Members[1]; m.Kind != Object || string(m.Value) != `{"a":1}` {
		t.Fatalf("content that is not a string is kept: %+v", m)
	}
}

// errReader fails after its data.
type errReader struct {
	data []byte
	err  error
}

func (e *errReader) Read(b []byte) (int, error) {
	if len(e.data) == 0 {
		return 0, e.err
	}
	n := copy(b, e.data)
	e.data = e.data[n:]
	return n, nil
}

func TestInputErrorsReachBothReaders(t *testing.T) {
	limit := errors.New("body too large")
	var seen error
	r := Reader{Stream: "content", OnStream: func(_ []Member, content io.Reader) error {
		_, seen = io.Copy(io.Discard, content)
		return nil // swallowed here, yet Read must still fail
	}}
	_, err := r.Read(&errReader{data: []byte(`{"content":"` + strings.Repeat("A", 100<<10)), err: limit})
	if !errors.Is(err, limit) || !errors.Is(seen, limit) {
		t.Fatalf("Read: %v; content reader: %v", err, seen)
	}

	// A syntax error inside the string reaches the content's reader too.
	_, err = r.Read(strings.NewReader(`{"content":"AAAA\q"}`))
	var se *SyntaxError
	if !errors.As(err, &se) || !errors.As(seen, &se) {
		t.Fatalf("Read: %v; content reader: %v", err, seen)
	}

	stop := errors.New("stop")
	r.OnStream = func([]Member, io.Reader) error { return stop }
	if _, err := r.Read(strings.NewReader(`{"content":"x"}`)); !errors.Is(err, stop) {
		t.Fatalf("OnStream's error: %v", err)
	}
}

// hugeContent is an upload body whose content is n bytes of base64,
// produced as it is read.
type hugeContent struct {
	n, off int
	head   string
}

func (h *hugeContent) Read(b []byte) (int, error) {
	total := len(h.head) + h.n + 2
	if h.off >= total {
		return 0, io.EOF
	}
	i := 0
	for i < len(b) && h.off < total {
		switch {
		case h.off < len(h.head):
			b[i] = h.head[h.off]
		case h.off < len(h.head)+h.n:
			b[i] = "QUJD"[(h.off-len(h.head))%4]
		case h.off == len(h.head)+h.n:
			b[i] = '"'
		default:
			b[i] = '}'
		}
		i++
		h.off++
	}
	return i, nil
}

func TestStreamsWithoutHoldingTheString(t *testing.T) {
	const n = 64 << 20
	grew := testenv.HeapPeak()
	var got int64
	r := Reader{Stream: "content", Keep: []string{"path"}, MaxValue: 1 << 10,
		OnStream: func(_ []Member, content io.Reader) error {
			var err error
			got, err = io.Copy(io.Discard, content)
			return err
		}}
	res, err := r.Read(&hugeContent{n: n, head: `{"path":"/big","content":"`})
	peak := grew()
	if err != nil || got != n || res.Kind != Object {
		t.Fatalf("read %d of %d bytes: %+v %v", got, n, res, err)
	}
	t.Logf("the heap grew by %d KiB reading a %d MiB string", peak>>10, n>>20)
	if peak > 4<<20 {
		t.Fatalf("reading a %d MiB string grew the heap by %d MiB", n>>20, peak>>20)
	}
}

func BenchmarkStream(b *testing.B) {
	const n = 64 << 20
	b.SetBytes(n)
	r := Reader{Stream: "content", OnStream: func(_ []Member, content io.Reader) error {
		_, err := io.Copy(io.Discard, content)
		return err
	}}
	for b.Loop() {
		if _, err := r.Read(&hugeContent{n: n, head: `{"content":"`}); err != nil {
			b.Fatal(err)
		}
	}
}
