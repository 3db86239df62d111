package iptrace

import (
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"kube-proxy/rules/internal/netnstest"
)

func mustRestore(t *testing.T, ts *Tables, payload string, noflush bool) {
	t.Helper()
	if err := ts.Restore([]byte(payload), RestoreOptions{NoFlush: noflush}); err != nil {
		t.Fatalf("restore: %v\npayload:\n%s", err, payload)
	}
}

// TestSaveLikeIPTablesSave checks the canonical printing against what iptables-nft-save 1.8.9 printed for
// the same payloads (testdata/*.saved were captured from a real kernel; TestSaveAgainstKernel redoes it).
func TestSaveLikeIPTablesSave(t *testing.T) {
	for _, tc := range []struct {
		name string
		ipv6 bool
	}{{"rich4", false}, {"rich6", true}} {
		t.Run(tc.name, func(t *testing.T) {
			payload, err := os.ReadFile("testdata/" + tc.name + ".restore")
			if err != nil {
				t.Fatal(err)
			}
			want, err := os.ReadFile("testdata/" + tc.name + ".saved")
			if err != nil {
				t.Fatal(err)
			}
			ts := New(tc.ipv6)
			mustRestore(t, ts, string(payload), true)
			got := ts.Save("filter") + ts.Save("nat")
			if diff := cmp.Diff(string(want), got); diff != "" {
				t.Errorf("Save differs from iptables-save (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSaveAgainstKernel loads the same payloads into a real kernel with both backends and compares
// iptables-save's output with Save's.
func TestSaveAgainstKernel(t *testing.T) {
	for _, backend := range netnstest.Backends {
		for _, tc := range []struct {
			name string
			ipv6 bool
		}{{"rich4", false}, {"rich6", true}} {
			t.Run(backend+"/"+tc.name, func(t *testing.T) {
				ns := netnstest.New(t)
				netnstest.Check(t, backend, tc.ipv6)
				payload, err := os.ReadFile("testdata/" + tc.name + ".restore")
				if err != nil {
					t.Fatal(err)
				}
				if err := ns.Restore(backend, tc.ipv6, payload, "--noflush"); err != nil {
					t.Fatal(err)
				}
				ts := New(tc.ipv6)
				mustRestore(t, ts, string(payload), true)
				checkAgainstKernel(t, ns, backend, ts)
			})
		}
	}
}

// checkAgainstKernel compares Save of the filter and nat tables with iptables-save in ns.
func checkAgainstKernel(t *testing.T, ns *netnstest.NS, backend string, ts *Tables) {
	t.Helper()
	for _, table := range []string{"filter", "nat"} {
		real, err := ns.Save(backend, ts.ipv6, table)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(real, ts.Save(table)); diff != "" {
			t.Errorf("table %s: Save differs from the kernel's (-kernel +iptrace):\n%s", table, diff)
		}
	}
}

// restoreCases are payloads applied in order to one state; each either succeeds or fails with an error
// containing errPart, and a failure leaves the state as it was.
var restoreCases = []struct {
	name    string
	payload string
	errPart string // "" for success
}{
	{"jump to missing chain", "*nat\n:KUBE-A - [0:0]\n-A KUBE-A -j KUBE-MISSING\nCOMMIT\n", "chain 'KUBE-MISSING' does not exist"},
	{"append to missing chain", "*nat\n-A KUBE-NOPE -j ACCEPT\nCOMMIT\n", "No chain/target/match by that name"},
	{"create two chains", "*nat\n:KUBE-A - [0:0]\n:KUBE-B - [0:0]\n-A KUBE-A -j KUBE-B\nCOMMIT\n", ""},
	{"delete referenced chain", "*nat\n-X KUBE-B\nCOMMIT\n", "Device or resource busy"},
	{"delete non-empty chain", "*nat\n-X KUBE-A\nCOMMIT\n", "Device or resource busy"},
	{"flush then delete both", "*nat\n:KUBE-A - [0:0]\n-X KUBE-A\n-X KUBE-B\nCOMMIT\n", ""},
	{"delete missing chain", "*nat\n-X KUBE-C\nCOMMIT\n", "No chain/target/match by that name"},
	{"DROP in nat", "*nat\n:KUBE-C - [0:0]\n-A KUBE-C -j DROP\nCOMMIT\n", "not intended for filtering"},
	{"DNAT in filter", "*filter\n:KUBE-C - [0:0]\n-A KUBE-C -j DNAT --to-destination 1.2.3.4:80\nCOMMIT\n", "only valid in the nat table"},
	{"delete missing rule", "*filter\n:KUBE-C - [0:0]\n-A KUBE-C -j ACCEPT\n-D KUBE-C -j RETURN\nCOMMIT\n", "does a matching rule exist"},
	{"tcp match without -p", "*filter\n:KUBE-C - [0:0]\n-A KUBE-C -m tcp --dport 80 -j ACCEPT\nCOMMIT\n", "needs \"-p tcp\""},
	{"missing COMMIT", "*filter\n:KUBE-C - [0:0]\n", "COMMIT expected"},
	{"unknown table", "*nope\nCOMMIT\n", "Table does not exist"},
	{"bad address", "*filter\n:KUBE-C - [0:0]\n-A KUBE-C -d 300.1.1.1 -j ACCEPT\nCOMMIT\n", "not found"},
	{"insert and delete by spec", "*filter\n:KUBE-C - [0:0]\n-A KUBE-C -j ACCEPT\n-I KUBE-C -p tcp -m tcp --dport 80 -j RETURN\n-D KUBE-C -p tcp --dport 80 -j RETURN\nCOMMIT\n", ""},
}

func TestRestoreErrors(t *testing.T) {
	ts := New(false)
	for _, tc := range restoreCases {
		before := ts.SaveAll()
		err := ts.Restore([]byte(tc.payload), RestoreOptions{NoFlush: true})
		switch {
		case tc.errPart == "" && err != nil:
			t.Errorf("%s: unexpected error %v", tc.name, err)
		case tc.errPart != "" && err == nil:
			t.Errorf("%s: no error, want one containing %q", tc.name, tc.errPart)
		case tc.errPart != "" && !strings.Contains(err.Error(), tc.errPart):
			t.Errorf("%s: error %q does not contain %q", tc.name, err, tc.errPart)
		}
		if err != nil && ts.SaveAll() != before {
			t.Errorf("%s: failed restore changed the state", tc.name)
		}
	}
	if got := ts.Rules("filter", "KUBE-C"); !cmp.Equal(got, []string{"-j ACCEPT"}) {
		t.Errorf("KUBE-C = %q, want only the ACCEPT rule", got)
	}
}

// TestRestoreErrorsAgainstKernel applies the same sequence to a real kernel and checks that it accepts and
// refuses the same payloads (the wording of errors differs between backends).
func TestRestoreErrorsAgainstKernel(t *testing.T) {
	for _, backend := range netnstest.Backends {
		t.Run(backend, func(t *testing.T) {
			ns := netnstest.New(t)
			netnstest.Check(t, backend, false)
			ts := New(false)
			for _, tc := range restoreCases {
				if tc.name == "unknown table" {
					continue // the kernel's answer depends on loadable modules
				}
				realErr := ns.Restore(backend, false, []byte(tc.payload), "--noflush")
				fakeErr := ts.Restore([]byte(tc.payload), RestoreOptions{NoFlush: true})
				if (realErr == nil) != (fakeErr == nil) {
					t.Errorf("%s: kernel error %v, iptrace error %v", tc.name, realErr, fakeErr)
				}
			}
			checkAgainstKernel(t, ns, backend, ts)
		})
	}
}

func TestNoFlushSemantics(t *testing.T) {
	ts := New(false)
	mustRestore(t, ts, `*nat
:PREROUTING ACCEPT [0:0]
:KUBE-A - [0:0]
:KUBE-B - [0:0]
:OTHER - [0:0]
-A PREROUTING -j KUBE-A
-A KUBE-A -j KUBE-B
-A KUBE-B -j RETURN
-A OTHER -j RETURN
COMMIT
`, true)
	// Declared chains are flushed, undeclared ones and built-in chains are kept.
	mustRestore(t, ts, "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-B - [0:0]\n-A KUBE-B -j MASQUERADE\nCOMMIT\n", true)
	want := `*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-A - [0:0]
:KUBE-B - [0:0]
:OTHER - [0:0]
-A PREROUTING -j KUBE-A
-A KUBE-A -j KUBE-B
-A KUBE-B -j MASQUERADE
-A OTHER -j RETURN
COMMIT
`
	if diff := cmp.Diff(want, ts.Save("nat")); diff != "" {
		t.Errorf("after --noflush (-want +got):\n%s", diff)
	}
	// Without --noflush the table is replaced.
	mustRestore(t, ts, "*nat\n:KUBE-B - [0:0]\nCOMMIT\n", false)
	if got := ts.Chains("nat"); !cmp.Equal(got, []string{"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING", "KUBE-B"}) {
		t.Errorf("chains after a flushing restore: %q", got)
	}
	// --test changes nothing.
	before := ts.SaveAll()
	if err := ts.Restore([]byte("*nat\n:KUBE-Z - [0:0]\nCOMMIT\n"), RestoreOptions{NoFlush: true, Test: true}); err != nil {
		t.Fatal(err)
	}
	if ts.SaveAll() != before {
		t.Error("--test changed the state")
	}
}

func TestRun(t *testing.T) {
	ts := New(false)
	steps := []struct {
		args    []string
		out     string
		wantErr bool
	}{
		{[]string{"-t", "nat", "-n", "-L", "KUBE-SERVICES"}, "", true},
		{[]string{"-t", "nat", "-N", "KUBE-SERVICES"}, "", false},
		{[]string{"-t", "nat", "-n", "-L", "KUBE-SERVICES"}, "Chain KUBE-SERVICES (0 references)\n", false},
		{[]string{"-t", "nat", "-N", "KUBE-SERVICES"}, "", true},
		{[]string{"-w", "5", "-t", "nat", "-C", "PREROUTING", "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES"}, "", true},
		{[]string{"-t", "nat", "-I", "PREROUTING", "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES"}, "", false},
		{[]string{"-t", "nat", "-C", "PREROUTING", "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES"}, "", false},
		{[]string{"-t", "nat", "-I", "PREROUTING", "1", "-j", "RETURN"}, "", false},
		{[]string{"-t", "nat", "-S", "PREROUTING"}, "-P PREROUTING ACCEPT\n-A PREROUTING -j RETURN\n-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n", false},
		{[]string{"-t", "nat", "-X", "KUBE-SERVICES"}, "", true},
		{[]string{"-t", "nat", "-D", "PREROUTING", "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES"}, "", false},
		{[]string{"-t", "nat", "-D", "PREROUTING", "1"}, "", false},
		{[]string{"-t", "nat", "-X", "KUBE-SERVICES"}, "", false},
		{[]string{"-t", "nat", "-S", "KUBE-SERVICES"}, "", true},
	}
	for i, s := range steps {
		out, err := ts.Run(s.args...)
		if (err != nil) != s.wantErr {
			t.Fatalf("step %d %q: error %v, want error %v", i, s.args, err, s.wantErr)
		}
		if out != s.out {
			t.Errorf("step %d %q: output %q, want %q", i, s.args, out, s.out)
		}
	}
}
