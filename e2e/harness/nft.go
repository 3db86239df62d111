package harness

import (
	"fmt"
	"slices"
	"strings"
)

// NFTTable is one table of `nft list table` / `nft list ruleset` output, parsed by ParseNFT.
type NFTTable struct {
	// Family and Name say which table: "ip" and "kube-proxy".
	Family, Name string
	// Lines are the table's own lines (its comment, flags), trimmed, in order.
	Lines []string
	// Blocks are the table's chains, sets, maps and other objects, in listing order.
	Blocks []*NFTBlock
}

// NFTBlock is one object of a table: a chain, set, map, counter, ...
type NFTBlock struct {
	// Kind is what the listing calls the object ("chain", "set", "map", "counter", "ct helper", ...).
	Kind string
	// Name is the object's name.
	Name string
	// Lines are the block's lines, trimmed, in order, without its elements: a set's type, flags and
	// comment; a chain's type/hook line and comment, then one line per rule.
	Lines []string
	// Elements are the elements of a set or map, one entry each, as listed (e.g.
	// `10.96.0.1 . tcp . 443 comment "default/kubernetes:https" : goto reject-chain`), in listing order;
	// nil when the listing shows no `elements = { ... }`.
	Elements []string
}

// Key is "kind name", unique within a table.
func (b *NFTBlock) Key() string { return b.Kind + " " + b.Name }

// Rules returns a chain's rules: its lines besides the base chain's "type ... hook ..." line and the
// chain's own comment.
func (b *NFTBlock) Rules() []string {
	var out []string
	for _, l := range b.Lines {
		if strings.HasPrefix(l, "type ") || strings.HasPrefix(l, "comment \"") {
			continue
		}
		out = append(out, l)
	}
	return out
}

// Block returns the block of kind and name, nil when there is none.
func (t *NFTTable) Block(kind, name string) *NFTBlock {
	for _, b := range t.Blocks {
		if b.Kind == kind && b.Name == name {
			return b
		}
	}
	return nil
}

// Names returns the names of the table's blocks of kind, in listing order.
func (t *NFTTable) Names(kind string) []string {
	var out []string
	for _, b := range t.Blocks {
		if b.Kind == kind {
			out = append(out, b.Name)
		}
	}
	return out
}

// ParseNFT parses the tables of an `nft list` output (`nft list table ...`, `nft list ruleset`; not
// `nft -j`, nor the listings of single chains or sets). Blank lines are dropped and every line is
// trimmed; an `elements = { ... }` that nft wrapped over several lines becomes one entry per element.
func ParseNFT(listing string) ([]*NFTTable, error) {
	var (
		tables []*NFTTable
		table  *NFTTable
		block  *NFTBlock
		elems  *strings.Builder // an elements = { ... } still open
	)
	for n, raw := range strings.Split(listing, "\n") {
		line := strings.TrimSpace(raw)
		errorf := func(format string, a ...any) error {
			return fmt.Errorf("nft listing line %d %q: %s", n+1, line, fmt.Sprintf(format, a...))
		}
		switch {
		case elems != nil:
			elems.WriteString(" " + line)
			if depth(elems.String()) == 0 {
				items, err := elementsOf(elems.String())
				if err != nil {
					return nil, errorf("%v", err)
				}
				block.Elements = items
				elems = nil
			}
		case line == "":
		case table == nil:
			f := strings.Fields(line)
			if len(f) != 4 || f[0] != "table" || f[3] != "{" {
				return nil, errorf("want a table header")
			}
			table = &NFTTable{Family: f[1], Name: f[2]}
			tables = append(tables, table)
		case block == nil && line == "}":
			table = nil
		case block == nil && strings.HasSuffix(line, " {"):
			f := strings.Fields(strings.TrimSuffix(line, " {"))
			if len(f) < 2 {
				return nil, errorf("want a block header")
			}
			block = &NFTBlock{Kind: strings.Join(f[:len(f)-1], " "), Name: f[len(f)-1]}
			table.Blocks = append(table.Blocks, block)
		case block == nil:
			table.Lines = append(table.Lines, line)
		case line == "}":
			block = nil
		case strings.HasPrefix(line, "elements = {"):
			elems = &strings.Builder{}
			elems.WriteString(line)
			if depth(line) == 0 {
				items, err := elementsOf(line)
				if err != nil {
					return nil, errorf("%v", err)
				}
				block.Elements = items
				elems = nil
			}
		default:
			block.Lines = append(block.Lines, line)
		}
	}
	if table != nil || elems != nil {
		return nil, fmt.Errorf("nft listing ends inside table %s %s", table.Family, table.Name)
	}
	return tables, nil
}

// braces calls visit for every brace of s outside double quotes, with its index and the depth after it
// (1 after an outermost '{', 0 after the '}' closing it), until visit returns false; it returns the depth
// at the end.
func braces(s string, visit func(i, depth int) bool) int {
	d, quoted := 0, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"':
			quoted = !quoted
		case quoted:
		case c == '{', c == '}':
			if c == '{' {
				d++
			} else {
				d--
			}
			if visit != nil && !visit(i, d) {
				return d
			}
		}
	}
	return d
}

// depth returns how many braces s leaves open, outside double quotes.
func depth(s string) int { return braces(s, nil) }

// elementsOf splits "elements = { a, b, c }" into its entries.
func elementsOf(s string) ([]string, error) {
	i, j := strings.Index(s, "{"), strings.LastIndex(s, "}")
	if i < 0 || j < i {
		return nil, fmt.Errorf("no braces around the elements")
	}
	return splitTop(s[i+1 : j]), nil
}

// splitTop splits s at the commas outside braces and double quotes, trimming each part and folding
// runs of white space outside quotes; empty parts are dropped.
func splitTop(s string) []string {
	var out []string
	var cur strings.Builder
	d, quoted, space := 0, false, false
	flush := func() {
		if p := strings.TrimSpace(cur.String()); p != "" {
			out = append(out, p)
		}
		cur.Reset()
		space = false
	}
	for _, r := range s {
		switch {
		case r == '"':
			quoted = !quoted
		case quoted:
		case r == '{':
			d++
		case r == '}':
			d--
		case r == ',' && d == 0:
			flush()
			continue
		case r == ' ' || r == '\t':
			space = true
			continue
		}
		if space && cur.Len() > 0 {
			cur.WriteByte(' ')
		}
		space = false
		cur.WriteRune(r)
	}
	flush()
	return out
}

// Normalized renders the table with its blocks sorted by kind and name, the elements of each set and
// map sorted, and the entries of every anonymous set or map written in a rule (`{ a, b }`) sorted: two
// listings of the same table that differ only in the order the kernel keeps elements and objects in
// read the same. Nothing else changes: rules keep their order, and every other line is as listed.
func (t *NFTTable) Normalized() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "table %s %s {\n", t.Family, t.Name)
	for _, l := range t.Lines {
		sb.WriteString("\t" + l + "\n")
	}
	blocks := slices.Clone(t.Blocks)
	slices.SortStableFunc(blocks, func(a, b *NFTBlock) int {
		if c := strings.Compare(a.Kind, b.Kind); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	for _, b := range blocks {
		fmt.Fprintf(&sb, "\t%s %s {\n", b.Kind, b.Name)
		for _, l := range b.Lines {
			sb.WriteString("\t\t" + SortAnonymousSets(l) + "\n")
		}
		if b.Elements != nil {
			sb.WriteString("\t\telements = {\n")
			for _, e := range slices.Sorted(slices.Values(b.Elements)) {
				sb.WriteString("\t\t\t" + e + "\n")
			}
			sb.WriteString("\t\t}\n")
		}
		sb.WriteString("\t}\n")
	}
	sb.WriteString("}\n")
	return sb.String()
}

// SortAnonymousSets sorts the entries of every brace group of a rule line ("{ 0 : a, 1 : b }",
// "{ 10.0.0.0/8, 192.168.0.0/16 }"), innermost first, outside double quotes; the rest of the line is
// unchanged.
func SortAnonymousSets(line string) string {
	var out strings.Builder
	rest := line
	for {
		i := openBrace(rest)
		if i < 0 {
			out.WriteString(rest)
			return out.String()
		}
		j := closeBrace(rest, i)
		if j < 0 {
			out.WriteString(rest)
			return out.String()
		}
		items := splitTop(rest[i+1 : j])
		for k := range items {
			items[k] = SortAnonymousSets(items[k])
		}
		slices.Sort(items)
		out.WriteString(rest[:i] + "{ " + strings.Join(items, ", ") + " }")
		rest = rest[j+1:]
	}
}

// openBrace returns the index of the first '{' outside double quotes, -1 if none.
func openBrace(s string) int {
	at := -1
	braces(s, func(i, d int) bool {
		if s[i] == '{' {
			at = i
		}
		return at < 0
	})
	return at
}

// closeBrace returns the index of the '}' closing the '{' at open, -1 if none.
func closeBrace(s string, open int) int {
	at := -1
	braces(s[open:], func(i, d int) bool {
		if d == 0 {
			at = open + i
		}
		return at < 0
	})
	return at
}

// NormalizeNFT parses a listing and renders each of its tables Normalized, tables sorted by family and
// name.
func NormalizeNFT(listing string) (string, error) {
	tables, err := ParseNFT(listing)
	if err != nil {
		return "", err
	}
	slices.SortFunc(tables, func(a, b *NFTTable) int {
		return strings.Compare(a.Family+" "+a.Name, b.Family+" "+b.Name)
	})
	var sb strings.Builder
	for _, t := range tables {
		sb.WriteString(t.Normalized())
	}
	return sb.String(), nil
}
