package config

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// FuzzDecode feeds arbitrary bytes to Decode. It must never panic, every
// error must be a *FieldError naming the file, and a config that loads must
// survive Marshal and load again to the same bytes (what --write-config-to
// relies on). Seeds: testdata/*.yaml, the example, and testdata/fuzz/FuzzDecode.
func FuzzDecode(f *testing.F) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.yaml"))
	if err != nil {
		f.Fatal(err)
	}
	for _, p := range append(files, exampleFile) {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Decode("fuzz.yaml", data)
		if err != nil {
			parts := []error{err}
			if j, ok := err.(interface{ Unwrap() []error }); ok {
				parts = j.Unwrap()
			}
			for _, p := range parts {
				var fe *FieldError
				if !errors.As(p, &fe) || fe.File != "fuzz.yaml" || fe.Msg == "" {
					t.Fatalf("error %q (%T) is not a *FieldError for fuzz.yaml with a message", p, p)
				}
			}
			return
		}
		out, err := Marshal(c)
		if err != nil {
			t.Fatalf("Marshal of a loaded config: %v", err)
		}
		back, err := Decode("marshaled.yaml", out)
		if err != nil {
			t.Fatalf("Marshal output does not load: %v\n%s", err, out)
		}
		again, err := Marshal(back)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out, again) {
			t.Fatalf("Marshal → Decode → Marshal changed the config:\n%s\n---\n%s", out, again)
		}
	})
}
