// Package zpagestest renders HTTP answers in the form of the captures of upstream's metrics port kept in
// testdata (proxy/zpages/testdata/upstream/README.md), so that tests compare an answer with upstream's.
package zpagestest

import (
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
)

// Dump renders resp as the captures have it: the status code, the headers other than Date and
// Content-Length (sorted, one per line, values joined by commas), a blank line and the body. It reads
// and closes the body.
func Dump(resp *http.Response) string {
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var hs []string
	for k, v := range resp.Header {
		if k != "Date" && k != "Content-Length" {
			hs = append(hs, k+": "+strings.Join(v, ","))
		}
	}
	sort.Strings(hs)
	return fmt.Sprintf("%d\n%s\n\n%s", resp.StatusCode, strings.Join(hs, "\n"), body)
}
