package systemd

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"
	"syscall"

	"k8s.io/klog/v2"
)

// ErrFDStoreFull is returned by FDStore.Store when the store holds as many entries as the unit's
// FileDescriptorStoreMax= allows.
var ErrFDStoreFull = errors.New("the file descriptor store is full (FileDescriptorStoreMax=)")

// FDStore is this unit's file descriptor store in the service manager (FileDescriptorStoreMax= in
// kube-proxy.service): a descriptor stored there with FDSTORE=1 outlives the process, and systemd passes
// it, with its name, to the unit's next process (LISTEN_FDS, LISTEN_FDNAMES) when the unit restarts
// (`systemctl restart`, or Restart= after a failure); a stop empties the store. Entries are named
// (FDNAME=); FDSTOREREMOVE=1 drops every entry of a name.
//
// Without a service manager (no NOTIFY_SOCKET) Store and Remove do nothing and Take finds nothing, so
// the daemon behaves as it would without a store. Its methods are safe for concurrent use.
type FDStore struct {
	// send delivers one notification to the service manager, with fd attached unless it is negative;
	// nil without a service manager.
	send func(state string, fd int) error
	// max is the number of entries the store takes ($FDSTORE, which systemd 254 and later set); 0 when the
	// service manager does not say (systemd 252), and then systemd itself refuses what is over its limit.
	max int

	mu sync.Mutex
	// inherited are the descriptors the previous process stored, by name, not taken yet.
	inherited map[string][]*os.File
	// entries counts the store's entries by name, as far as this process knows: inherited and stored.
	entries map[string]int
	// fullLogged is set once a full store has been logged.
	fullLogged bool
}

// newFDStore returns a store holding inherited (by name), that notifies with send (nil: no service
// manager) and takes max entries (0: unknown).
func newFDStore(inherited map[string][]*os.File, send func(string, int) error, max int) *FDStore {
	s := &FDStore{send: send, max: max, inherited: map[string][]*os.File{}, entries: map[string]int{}}
	for name, files := range inherited {
		s.inherited[name] = files
		s.entries[name] = len(files)
	}
	return s
}

// Inherited returns how many descriptors the previous process stored, not taken yet.
func (s *FDStore) Inherited() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, files := range s.inherited {
		n += len(files)
	}
	return n
}

// Take returns the descriptor stored under name by an earlier process, or nil; the caller owns the file.
// The entry stays in the store. Should several have the same name, the first is returned and the others
// are closed here (they stay in the store until name is removed).
func (s *FDStore) Take(name string) *os.File {
	s.mu.Lock()
	defer s.mu.Unlock()
	files := s.inherited[name]
	delete(s.inherited, name)
	if len(files) == 0 {
		return nil
	}
	for _, f := range files[1:] {
		_ = f.Close()
	}
	return files[0]
}

// Store keeps c's descriptor in the store under name (FDSTORE=1, FDNAME=name, FDPOLL=0: the service
// manager keeps it until it is removed, whatever poll(2) says of it), in place of what name held. The
// descriptor stays open in this process too. It returns ErrFDStoreFull, without sending, when the store
// is known to be full.
func (s *FDStore) Store(name string, c syscall.Conn) error {
	if s.send == nil {
		return nil
	}
	if err := validFDName(name); err != nil {
		return err
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return fmt.Errorf("storing %s: %w", name, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.entries[name] > 0 {
		if err := s.removeLocked(name); err != nil {
			return err
		}
	}
	if s.max > 0 && s.total() >= s.max {
		if !s.fullLogged {
			s.fullLogged = true
			klog.InfoS("The file descriptor store is full; further listeners will not survive a restart (raise FileDescriptorStoreMax= in the unit)", "max", s.max)
		}
		return ErrFDStoreFull
	}
	var sendErr error
	if err := rc.Control(func(fd uintptr) {
		sendErr = s.send("FDSTORE=1\nFDNAME="+name+"\nFDPOLL=0", int(fd))
	}); err != nil {
		return fmt.Errorf("storing %s: %w", name, err)
	}
	if sendErr != nil {
		return fmt.Errorf("storing %s: %w", name, sendErr)
	}
	s.entries[name]++
	return nil
}

// Remove drops every entry stored under name (FDSTOREREMOVE=1) and closes what this process inherited
// under it and did not take.
func (s *FDStore) Remove(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.removeLocked(name)
}

func (s *FDStore) removeLocked(name string) error {
	for _, f := range s.inherited[name] {
		_ = f.Close()
	}
	delete(s.inherited, name)
	if s.send == nil || s.entries[name] == 0 {
		return nil
	}
	if err := s.send("FDSTOREREMOVE=1\nFDNAME="+name, -1); err != nil {
		return fmt.Errorf("removing %s from the file descriptor store: %w", name, err)
	}
	delete(s.entries, name)
	return nil
}

// ReleaseUnclaimed removes from the store, and closes, what the previous process stored and this one did
// not take: the listeners of Service ports that went away while no process ran, or of a mode that is
// no longer in use. It returns the names released.
func (s *FDStore) ReleaseUnclaimed() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	names := make([]string, 0, len(s.inherited))
	for name := range s.inherited {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if err := s.removeLocked(name); err != nil {
			klog.ErrorS(err, "Could not release a stored descriptor", "name", name)
		}
	}
	if len(names) > 0 {
		klog.V(2).InfoS("Released stored descriptors no one took", "count", len(names))
	}
	return names
}

// total is the number of entries in the store.
func (s *FDStore) total() int {
	n := 0
	for _, c := range s.entries {
		n += c
	}
	return n
}

// validFDName checks a name as systemd checks FDNAME=: at most 255 bytes of printable ASCII without ':',
// which separates LISTEN_FDNAMES (and here, neither empty nor holding a space).
func validFDName(name string) error {
	if name == "" || len(name) > 255 {
		return fmt.Errorf("descriptor name %q: must be 1 to 255 bytes long", name)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c <= ' ' || c > '~' || c == ':' {
			return fmt.Errorf("descriptor name %q: byte %d (%q) is not printable ASCII other than ':' and space", name, i, c)
		}
	}
	return nil
}
