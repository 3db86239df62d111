package iptables

import "regexp"

// serviceCommentRE matches the Service port name ("ns/name" or "ns/name:port", svcState.name) that the
// comments of a Service port's rules begin with: "ns/name:port cluster IP", "ns/name:port -> IP:PORT",
// "ns/name:port has no endpoints", or the name alone.
var serviceCommentRE = regexp.MustCompile(`^([a-z0-9.-]+/[a-z0-9.-]+(?::[a-z0-9-]+)?)`)

// ServiceOfComment returns the Service port a rule's comment names at its start, as the renderer writes
// the comments of a Service port's rules; "" when it names none (the shared rules' comments, such as
// "kubernetes service portals").
func ServiceOfComment(comment string) string {
	if m := serviceCommentRE.FindStringSubmatch(comment); m != nil {
		return m[1]
	}
	return ""
}
