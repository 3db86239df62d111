package main

import (
	"strings"
	"testing"
)

func TestUserspaceSectionReplacedInPlace(t *testing.T) {
	doc := "# Benchmarks\n\nintro\n"
	once := usUpdate(doc, "first\n")
	if !strings.HasPrefix(once, doc) || !strings.Contains(once, usBegin+"\nfirst\n"+usEnd) {
		t.Fatalf("appended section missing:\n%s", once)
	}
	twice := usUpdate(once+"\n## after\n", "second\n")
	if strings.Contains(twice, "first") || strings.Count(twice, usBegin) != 1 || !strings.Contains(twice, "second\n"+usEnd+"\n\n## after") {
		t.Fatalf("section not replaced in place:\n%s", twice)
	}
}
