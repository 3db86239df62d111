package systemdlab

import (
	"fmt"
	"regexp"
	"strings"
)

var labMarker = regexp.MustCompile(`^<!-- lab:([a-z0-9-]+) -->$`)

// DocBlocks returns the code blocks of a Markdown document that are marked to be run by the lab: a line
// "<!-- lab:NAME -->" directly followed by a fenced block. The map goes from NAME to the block's body.
// A marker not followed by a fence, an unterminated fence or a repeated NAME is an error.
func DocBlocks(markdown string) (map[string]string, error) {
	lines := strings.Split(markdown, "\n")
	blocks := map[string]string{}
	for i := 0; i < len(lines); i++ {
		m := labMarker.FindStringSubmatch(strings.TrimSpace(lines[i]))
		if m == nil {
			continue
		}
		name := m[1]
		if _, dup := blocks[name]; dup {
			return nil, fmt.Errorf("line %d: block %q marked twice", i+1, name)
		}
		if i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], "```") {
			return nil, fmt.Errorf("line %d: marker lab:%s is not followed by a fenced code block", i+1, name)
		}
		var body []string
		j := i + 2
		for ; j < len(lines) && !strings.HasPrefix(lines[j], "```"); j++ {
			body = append(body, lines[j])
		}
		if j == len(lines) {
			return nil, fmt.Errorf("line %d: code block lab:%s is not closed", i+2, name)
		}
		blocks[name] = strings.Join(body, "\n") + "\n"
		i = j
	}
	return blocks, nil
}
