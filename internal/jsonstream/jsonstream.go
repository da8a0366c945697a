// Package jsonstream reads one JSON object from a stream and hands the
// value of one string member to its caller as the bytes arrive. An upload's
// base64 content, hundreds of megabytes in a single JSON string, then never
// sits in memory: encoding/json holds every value whole, Decoder.Token's
// strings included.
//
// What it accepts is what encoding/json accepts (json.Valid): the same
// syntax, the same nesting limit, the same unescaping, member names matched
// as encoding/json matches field names (case-insensitively).
package jsonstream

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

const (
	// maxDepth is encoding/json's nesting limit: a document nested deeper
	// is invalid there, so it is invalid here.
	maxDepth = 10000
	// bufSize is the read buffer: large enough that a stream of hundreds
	// of megabytes costs few reads, small enough to be nothing per request.
	bufSize = 64 << 10
	// maxName bounds the part of a member name that is kept to match it:
	// no name this package is asked for is longer, so a longer one is
	// only validated.
	maxName = 256
)

// Kind is the JSON type of a value, named by the byte it starts with.
type Kind byte

// Kinds.
const (
	Object Kind = '{'
	Array  Kind = '['
	String Kind = '"'
	Number Kind = '0'
	Bool   Kind = 't'
	Null   Kind = 'n'
)

// SyntaxError is input that is not one valid JSON document.
type SyntaxError struct {
	Offset int64 // bytes read before the offending one
	msg    string
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("invalid JSON at byte %d: %s", e.Offset, e.msg)
}

// Member is a member of the object that Reader.Stream or Reader.Keep names.
type Member struct {
	Name string // as sent, unescaped
	Kind Kind
	// Value is the member's JSON text as sent, for a kept member; nil for
	// the streamed one when it is a string, and when TooLong.
	Value []byte
	// TooLong: the value is longer than Reader.MaxValue and was only
	// validated.
	TooLong bool
}

// StringMember is the value of the member of ms named name (matched as
// Reader matches names) when it is a JSON string that was kept.
func StringMember(ms []Member, name string) (string, bool) {
	for _, m := range ms {
		var v string
		if strings.EqualFold(m.Name, name) && m.Kind == String && m.Value != nil && json.Unmarshal(m.Value, &v) == nil {
			return v, true
		}
	}
	return "", false
}

// Reader reads one JSON object.
type Reader struct {
	// Stream names the member whose value, when it is a string, goes to
	// OnStream instead of memory. When it is not a string it is kept like
	// a member that Keep names.
	Stream string
	// Keep names the members whose JSON text is kept in Member.Value,
	// each up to MaxValue bytes. Every other member is validated and
	// dropped as it is read.
	Keep     []string
	MaxValue int
	// OnStream is called with the named members read so far and a reader
	// of the string's unescaped bytes. What it leaves unread is read and
	// dropped after it returns; an error it returns ends Read with that
	// error. A read error of the input (a size limit, a broken connection)
	// or a syntax error inside the string reaches OnStream's reads, and
	// Read returns it even if OnStream does not.
	OnStream func(before []Member, content io.Reader) error
}

// Result is what Read found.
type Result struct {
	// Kind is the kind of the top-level value; 0 when the input held
	// nothing but whitespace.
	Kind Kind
	// Size is how many bytes were read.
	Size int64
	// Members are the named members of a top-level object, in order.
	Members []Member
	// Duplicate is the name of a named member that appeared more than
	// once (only its first appearance is in Members), or "".
	Duplicate string
}

// Read reads one JSON value from r and checks that nothing but whitespace
// follows it.
func (o *Reader) Read(r io.Reader) (Result, error) {
	p := &parser{r: bufio.NewReaderSize(r, bufSize), o: o}
	res, err := p.document()
	res.Size = p.off
	return res, err
}

type parser struct {
	r   *bufio.Reader
	o   *Reader
	off int64
	err error // sticky: a read or syntax error ends everything

	// rec collects the raw text of the value being kept; nil otherwise.
	rec     []byte
	tooLong bool
}

func (p *parser) fail(err error) error {
	if p.err == nil {
		p.err = err
	}
	return p.err
}

func (p *parser) syntax(format string, args ...any) error {
	return p.fail(&SyntaxError{Offset: p.off, msg: fmt.Sprintf(format, args...)})
}

// peek returns the buffered input, at least one byte. The end of the input
// is io.EOF; callers inside a value turn it into a syntax error.
func (p *parser) peek() ([]byte, error) {
	if p.err != nil {
		return nil, p.err
	}
	if n := p.r.Buffered(); n > 0 {
		b, _ := p.r.Peek(n)
		return b, nil
	}
	if _, err := p.r.Peek(1); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, io.EOF
		}
		return nil, p.fail(err)
	}
	b, _ := p.r.Peek(p.r.Buffered())
	return b, nil
}

// consume moves past n buffered bytes, keeping them when a value is being
// kept.
func (p *parser) consume(b []byte, n int) {
	if p.rec != nil && !p.tooLong {
		if len(p.rec)+n > p.o.MaxValue {
			p.tooLong = true
		} else {
			p.rec = append(p.rec, b[:n]...)
		}
	}
	p.off += int64(n)
	_, _ = p.r.Discard(n)
}

// byte1 reads one byte inside a value.
func (p *parser) byte1() (byte, error) {
	b, err := p.peek()
	if err != nil {
		return 0, p.unexpectedEnd(err)
	}
	c := b[0]
	p.consume(b, 1)
	return c, nil
}

func (p *parser) unexpectedEnd(err error) error {
	if errors.Is(err, io.EOF) {
		return p.syntax("unexpected end of JSON input")
	}
	return err
}

// next skips whitespace and returns the next byte without consuming it.
func (p *parser) next() (byte, error) {
	for {
		b, err := p.peek()
		if err != nil {
			return 0, err
		}
		i := 0
		for i < len(b) && isSpace(b[i]) {
			i++
		}
		p.consume(b, i)
		if i < len(b) {
			return b[i], nil
		}
	}
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func (p *parser) document() (Result, error) {
	c, err := p.next()
	if errors.Is(err, io.EOF) {
		return Result{}, nil
	}
	if err != nil {
		return Result{}, err
	}
	var res Result
	if c == '{' {
		res.Kind = Object
		res.Members, res.Duplicate, err = p.object()
	} else {
		res.Kind, err = p.value(0)
	}
	if err != nil {
		return res, err
	}
	c, err = p.next()
	switch {
	case errors.Is(err, io.EOF):
		return res, nil
	case err != nil:
		return res, err
	}
	return res, p.syntax("invalid character %q after top-level value", c)
}

// object reads the top-level object, streaming and keeping what the
// Reader names.
func (p *parser) object() ([]Member, string, error) {
	b, _ := p.peek()
	p.consume(b, 1) // '{'
	var (
		members []Member
		dup     string
	)
	c, err := p.next()
	if err != nil {
		return nil, "", p.unexpectedEnd(err)
	}
	if c == '}' {
		b, _ := p.peek()
		p.consume(b, 1)
		return nil, "", nil
	}
	for {
		if c != '"' {
			return members, dup, p.syntax("invalid character %q looking for beginning of object key string", c)
		}
		name, err := p.name()
		if err != nil {
			return members, dup, err
		}
		if c, err = p.next(); err != nil {
			return members, dup, p.unexpectedEnd(err)
		}
		if c != ':' {
			return members, dup, p.syntax("invalid character %q after object key", c)
		}
		b, _ := p.peek()
		p.consume(b, 1)
		if c, err = p.next(); err != nil {
			return members, dup, p.unexpectedEnd(err)
		}

		named := p.o.Stream != "" && strings.EqualFold(name, p.o.Stream)
		stream := named && c == '"'
		for _, k := range p.o.Keep {
			named = named || strings.EqualFold(name, k)
		}
		seen := false
		for _, m := range members {
			seen = seen || strings.EqualFold(m.Name, name)
		}
		switch {
		case named && seen:
			// Only the first appearance counts; the caller decides what
			// a repeated member means.
			if dup == "" {
				dup = name
			}
			if _, err := p.value(1); err != nil {
				return members, dup, err
			}
		case stream:
			b, _ := p.peek()
			p.consume(b, 1) // '"'
			s := &str{p: p}
			if p.o.OnStream != nil {
				if err := p.o.OnStream(members, s); err != nil {
					return members, dup, err
				}
			}
			if _, err := io.Copy(io.Discard, s); err != nil {
				return members, dup, err
			}
			if p.err != nil {
				return members, dup, p.err
			}
			members = append(members, Member{Name: name, Kind: String})
		case named:
			p.rec, p.tooLong = make([]byte, 0, 64), false
			kind, err := p.value(1)
			m := Member{Name: name, Kind: kind, Value: p.rec, TooLong: p.tooLong}
			if m.TooLong {
				m.Value = nil
			}
			p.rec = nil
			if err != nil {
				return members, dup, err
			}
			members = append(members, m)
		default:
			if _, err := p.value(1); err != nil {
				return members, dup, err
			}
		}

		if c, err = p.next(); err != nil {
			return members, dup, p.unexpectedEnd(err)
		}
		b, _ = p.peek()
		p.consume(b, 1)
		switch c {
		case '}':
			return members, dup, nil
		case ',':
		default:
			return members, dup, p.syntax("invalid character %q after object key:value pair", c)
		}
		if c, err = p.next(); err != nil {
			return members, dup, p.unexpectedEnd(err)
		}
	}
}

// name reads a member name (its opening quote not yet consumed), keeping
// at most maxName bytes of it: a longer name matches nothing.
func (p *parser) name() (string, error) {
	b, _ := p.peek()
	p.consume(b, 1)
	var buf [maxName + 1]byte
	s := &str{p: p}
	n, err := io.ReadFull(s, buf[:])
	switch {
	case err == nil:
		// Longer than any name asked for: validate the rest.
		if _, err := io.Copy(io.Discard, s); err != nil {
			return "", err
		}
		return "", p.err
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return string(buf[:n]), p.err
	}
	return "", err
}

// value reads any value; depth is the nesting of the containers around it.
func (p *parser) value(depth int) (Kind, error) {
	c, err := p.next()
	if err != nil {
		return 0, p.unexpectedEnd(err)
	}
	switch {
	case c == '{' || c == '[':
		if depth+1 > maxDepth {
			return 0, p.syntax("exceeded max depth")
		}
		return Kind(c), p.container(c, depth+1)
	case c == '"':
		b, _ := p.peek()
		p.consume(b, 1)
		if _, err := io.Copy(io.Discard, &str{p: p}); err != nil {
			return String, err
		}
		return String, p.err
	case c == 't':
		return Bool, p.literal("true")
	case c == 'f':
		return Bool, p.literal("false")
	case c == 'n':
		return Null, p.literal("null")
	case c == '-' || ('0' <= c && c <= '9'):
		return Number, p.number()
	}
	return 0, p.syntax("invalid character %q looking for beginning of value", c)
}

// container reads an object or an array below the top level.
func (p *parser) container(open byte, depth int) error {
	b, _ := p.peek()
	p.consume(b, 1)
	end := byte(']')
	if open == '{' {
		end = '}'
	}
	c, err := p.next()
	if err != nil {
		return p.unexpectedEnd(err)
	}
	if c == end {
		b, _ := p.peek()
		p.consume(b, 1)
		return nil
	}
	for {
		if open == '{' {
			if c != '"' {
				return p.syntax("invalid character %q looking for beginning of object key string", c)
			}
			if _, err := p.value(depth); err != nil {
				return err
			}
			if c, err = p.next(); err != nil {
				return p.unexpectedEnd(err)
			}
			if c != ':' {
				return p.syntax("invalid character %q after object key", c)
			}
			b, _ := p.peek()
			p.consume(b, 1)
		}
		if _, err := p.value(depth); err != nil {
			return err
		}
		if c, err = p.next(); err != nil {
			return p.unexpectedEnd(err)
		}
		b, _ := p.peek()
		p.consume(b, 1)
		switch c {
		case end:
			return nil
		case ',':
		default:
			return p.syntax("invalid character %q after %s element", c, map[byte]string{'{': "object", '[': "array"}[open])
		}
		if c, err = p.next(); err != nil {
			return p.unexpectedEnd(err)
		}
	}
}

func (p *parser) literal(word string) error {
	for i := 0; i < len(word); i++ {
		c, err := p.byte1()
		if err != nil {
			return err
		}
		if c != word[i] {
			return p.syntax("invalid character %q in literal %s", c, word)
		}
	}
	return nil
}

// number reads -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? ; what
// follows it is the caller's to check.
func (p *parser) number() error {
	c, _ := p.peekByte()
	if c == '-' {
		p.take()
		c, _ = p.peekByte()
	}
	switch {
	case c == '0':
		p.take()
	case '1' <= c && c <= '9':
		p.digits()
	default:
		return p.numberEnd("in numeric literal")
	}
	if c, _ = p.peekByte(); c == '.' {
		p.take()
		if c, _ = p.peekByte(); !isDigit(c) {
			return p.numberEnd("after decimal point in numeric literal")
		}
		p.digits()
	}
	if c, _ = p.peekByte(); c == 'e' || c == 'E' {
		p.take()
		if c, _ = p.peekByte(); c == '+' || c == '-' {
			p.take()
			c, _ = p.peekByte()
		}
		if !isDigit(c) {
			return p.numberEnd("in exponent of numeric literal")
		}
		p.digits()
	}
	return p.err
}

func (p *parser) numberEnd(where string) error {
	c, ok := p.peekByte()
	if !ok {
		if p.err != nil {
			return p.err
		}
		return p.syntax("unexpected end of JSON input")
	}
	return p.syntax("invalid character %q %s", c, where)
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// peekByte is the next byte, or false at the end of the input or after an
// error (left in p.err).
func (p *parser) peekByte() (byte, bool) {
	b, err := p.peek()
	if err != nil {
		return 0, false
	}
	return b[0], true
}

func (p *parser) take() {
	b, _ := p.peek()
	p.consume(b, 1)
}

func (p *parser) digits() {
	for {
		b, err := p.peek()
		if err != nil {
			return
		}
		i := 0
		for i < len(b) && isDigit(b[i]) {
			i++
		}
		p.consume(b, i)
		if i < len(b) {
			return
		}
	}
}

// str reads the rest of a string whose opening quote is consumed, as its
// unescaped bytes, up to and including the closing quote.
type str struct {
	p       *parser
	pending []byte // unescaped bytes of an escape not yet returned
	buf     [utf8.UTFMax]byte
	done    bool
}

func (s *str) Read(b []byte) (int, error) {
	if len(s.pending) > 0 {
		n := copy(b, s.pending)
		s.pending = s.pending[n:]
		return n, nil
	}
	if s.done {
		return 0, io.EOF
	}
	if len(b) == 0 {
		return 0, nil
	}
	p := s.p
	chunk, err := p.peek()
	if err != nil {
		return 0, p.unexpectedEnd(err)
	}
	i := 0
	for i < len(chunk) && i < len(b) {
		c := chunk[i]
		if c < 0x20 || c == '"' || c == '\\' {
			break
		}
		i++
	}
	if i > 0 {
		copy(b, chunk[:i])
		p.consume(chunk, i)
		return i, nil
	}
	switch c := chunk[0]; {
	case c == '"':
		p.consume(chunk, 1)
		s.done = true
		return 0, io.EOF
	case c == '\\':
		p.consume(chunk, 1)
		r, err := s.escape()
		if err != nil {
			return 0, err
		}
		s.pending = s.buf[:utf8.EncodeRune(s.buf[:], r)]
		n := copy(b, s.pending)
		s.pending = s.pending[n:]
		return n, nil
	default:
		return 0, p.syntax("invalid character %q in string literal", c)
	}
}

// escape reads an escape after its backslash and returns the rune it
// stands for; a lone surrogate is U+FFFD, as encoding/json has it.
func (s *str) escape() (rune, error) {
	p := s.p
	c, err := p.byte1()
	if err != nil {
		return 0, err
	}
	switch c {
	case '"', '\\', '/':
		return rune(c), nil
	case 'b':
		return '\b', nil
	case 'f':
		return '\f', nil
	case 'n':
		return '\n', nil
	case 'r':
		return '\r', nil
	case 't':
		return '\t', nil
	case 'u':
	default:
		return 0, p.syntax("invalid character %q in string escape code", c)
	}
	r, err := s.hex4()
	if err != nil {
		return 0, err
	}
	if !utf16.IsSurrogate(r) {
		return r, nil
	}
	// A valid pair is one rune; anything else leaves what follows to be
	// read on its own.
	b, err := p.r.Peek(6)
	if err != nil && !errors.Is(err, io.EOF) && len(b) < 6 {
		// bufio hands a read error out once: keep it for the next read.
		p.fail(err)
	}
	if len(b) == 6 && b[0] == '\\' && b[1] == 'u' {
		if r2, ok := parseHex4(b[2:6]); ok {
			if pair := utf16.DecodeRune(r, r2); pair != utf8.RuneError {
				p.consume(b, 6)
				return pair, nil
			}
		}
	}
	return utf8.RuneError, nil
}

func (s *str) hex4() (rune, error) {
	var h [4]byte
	for i := range h {
		c, err := s.p.byte1()
		if err != nil {
			return 0, err
		}
		h[i] = c
	}
	r, ok := parseHex4(h[:])
	if !ok {
		return 0, s.p.syntax("invalid character in \\u hexadecimal character escape")
	}
	return r, nil
}

func parseHex4(b []byte) (rune, bool) {
	var r rune
	for _, c := range b {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}
