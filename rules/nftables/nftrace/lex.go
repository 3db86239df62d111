package nftrace

import (
	"fmt"
	"strings"
)

// token is one word of nft syntax. Quoted strings keep their text without the quotes and are marked, so
// `comment "{"` is not taken for a brace.
type token struct {
	text   string
	quoted bool
	line   int
}

func (t token) String() string {
	if t.quoted {
		return quote(t.text)
	}
	return t.text
}

// is reports whether t is the unquoted word w.
func (t token) is(w string) bool { return !t.quoted && t.text == w }

func quote(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}

// logicalLine is one statement of an nft file or of nft's listing: a command, a block header such as
// `chain X {`, a closing brace, or one line of a block's body. Braces that open on a line and close on a
// later one (set elements printed across lines) are joined into one logical line.
type logicalLine struct {
	toks []token
	line int // first physical line, from 1
}

// blockWords start the block headers of nft's listing (`table ip t {`, `chain c {`, `ct helper h {`).
var blockWords = map[string]bool{
	"table": true, "chain": true, "set": true, "map": true, "counter": true, "quota": true,
	"flowtable": true, "ct": true, "limit": true, "secmark": true, "synproxy": true,
}

// lex splits text into logical lines. Words are separated by blanks; "{", "}", ",", ";" are words of their
// own wherever they appear outside quotes; "#" starts a comment to the end of the line outside quotes.
func lex(text string) ([]logicalLine, error) {
	var out []logicalLine
	var cur []token
	depth, start := 0, 0
	lineNo := 1
	flush := func() {
		if len(cur) > 0 {
			out = append(out, logicalLine{toks: cur, line: start})
		}
		cur, depth = nil, 0
	}
	add := func(t token) {
		if len(cur) == 0 {
			start = t.line
		}
		cur = append(cur, t)
	}
	var word strings.Builder
	inWord := false
	endWord := func() {
		if inWord {
			add(token{text: word.String(), line: lineNo})
			word.Reset()
			inWord = false
		}
	}
	for i := 0; i < len(text); i++ {
		c := text[i]
		switch {
		case c == '"':
			endWord()
			var s strings.Builder
			j := i + 1
			for ; j < len(text) && text[j] != '"'; j++ {
				if text[j] == '\n' {
					return nil, fmt.Errorf("line %d: unterminated string", lineNo)
				}
				if text[j] == '\\' && j+1 < len(text) && (text[j+1] == '"' || text[j+1] == '\\') {
					j++
				}
				s.WriteByte(text[j])
			}
			if j >= len(text) {
				return nil, fmt.Errorf("line %d: unterminated string", lineNo)
			}
			add(token{text: s.String(), quoted: true, line: lineNo})
			i = j
		case c == '#':
			endWord()
			for i+1 < len(text) && text[i+1] != '\n' {
				i++
			}
		case c == '\n':
			endWord()
			switch {
			case depth == 0:
				flush()
			case depth == 1 && isBlockHeader(cur):
				flush()
			}
			lineNo++
		case c == ' ' || c == '\t' || c == '\r':
			endWord()
		case c == '{' || c == '}' || c == ',' || c == ';':
			endWord()
			if c == '}' && depth == 0 {
				// The end of a block opened by an earlier header.
				flush()
				add(token{text: "}", line: lineNo})
				flush()
				continue
			}
			add(token{text: string(c), line: lineNo})
			switch c {
			case '{':
				depth++
			case '}':
				depth--
			}
		default:
			word.WriteByte(c)
			inWord = true
		}
	}
	endWord()
	if depth > 0 && !isBlockHeader(cur) {
		return nil, fmt.Errorf("line %d: unbalanced braces", start)
	}
	flush()
	return out, nil
}

// isBlockHeader reports whether toks are `KEYWORD [WORD...] {` opening a block of nft's listing, as opposed
// to a command whose braces continue on the next line.
func isBlockHeader(toks []token) bool {
	n := len(toks)
	if n < 3 || n > 5 || !toks[n-1].is("{") || toks[0].quoted || !blockWords[toks[0].text] {
		return false
	}
	for _, t := range toks[1 : n-1] {
		if t.quoted || strings.ContainsAny(t.text, "{}=") {
			return false
		}
	}
	return true
}

// cursor walks the tokens of one logical line.
type cursor struct {
	toks []token
	pos  int
}

func (c *cursor) done() bool { return c.pos >= len(c.toks) }

func (c *cursor) peek() token {
	if c.done() {
		return token{}
	}
	return c.toks[c.pos]
}

func (c *cursor) peekIs(w string) bool { return !c.done() && c.toks[c.pos].is(w) }

func (c *cursor) next() token {
	t := c.peek()
	c.pos++
	return t
}

// accept consumes w if it is next.
func (c *cursor) accept(w string) bool {
	if c.peekIs(w) {
		c.pos++
		return true
	}
	return false
}

// expect consumes w or fails naming what was found instead.
func (c *cursor) expect(w string) error {
	if c.accept(w) {
		return nil
	}
	return c.unexpected("expected " + quote(w))
}

// word consumes an unquoted word that is not punctuation.
func (c *cursor) word(what string) (string, error) {
	t := c.peek()
	if c.done() || t.quoted || isPunct(t.text) {
		return "", c.unexpected("expected " + what)
	}
	c.pos++
	return t.text, nil
}

// str consumes a quoted string (or, as nft allows, a bare word).
func (c *cursor) str(what string) (string, error) {
	t := c.peek()
	if c.done() || (!t.quoted && isPunct(t.text)) {
		return "", c.unexpected("expected " + what)
	}
	c.pos++
	return t.text, nil
}

func (c *cursor) unexpected(want string) error {
	if c.done() {
		return fmt.Errorf("unexpected end of line, %s", want)
	}
	return fmt.Errorf("unexpected token %s, %s", c.peek(), want)
}

func isPunct(s string) bool {
	switch s {
	case "{", "}", ",", ";", ":", ".", "=":
		return true
	}
	return false
}
