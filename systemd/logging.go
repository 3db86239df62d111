package systemd

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	logsapi "k8s.io/component-base/logs/api/v1"
	logsjson "k8s.io/component-base/logs/json"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"kube-proxy/config"
)

// maxInfoBuffer caps logging.options.*.infoBufferSize, as upstream does.
const maxInfoBuffer = 2 << 30

// Logging puts the configuration's logging section in force. Start sets up the log format and its output
// streams, once, as upstream kube-proxy does (klog's text format or component-base's JSON format, errors
// and info split over stderr and stdout when asked, the info stream buffered). Apply changes what can
// change while running: verbosity, vmodule and flush frequency. The format and the output options
// (logging.format, logging.options) need a restart; config.ReloadPlan classifies them so.
//
// When stderr or stdout is the journal (systemd's JOURNAL_STREAM names it), each entry written to it
// carries its syslog priority (<3> errors, <4> warnings, <6> info), so `journalctl -p err -u kube-proxy`
// finds the errors.
type Logging struct {
	klogFlags      *flag.FlagSet
	stdout, stderr *os.File

	mu             sync.Mutex
	started        bool
	running        config.LoggingConfiguration
	setV           func(uint32) error // the logger's own verbosity threshold
	vmodule        flag.Value         // the text logger's own vmodule; nil in JSON
	flushFrequency time.Duration
}

// liveLoggingFields are the fields of the logging section that Apply puts in force on a running daemon;
// config.ReloadPlan must classify these, and only these, as live.
var liveLoggingFields = []string{"logging.verbosity", "logging.vmodule", "logging.flushFrequency"}

// NewLogging returns a Logging that writes to the process's stdout and stderr. klogFlags is the flag set
// klog.InitFlags filled: Logging sets klog's -v and -vmodule through it.
func NewLogging(klogFlags *flag.FlagSet) *Logging {
	return &Logging{klogFlags: klogFlags, stdout: os.Stdout, stderr: os.Stderr}
}

// Start sets up the log output for c, which must be valid, and puts its verbosity, vmodule and flush
// frequency in force. contextual is the ContextualLogging feature gate. Start can be called once.
func (l *Logging) Start(c config.LoggingConfiguration, contextual bool) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.started {
		return errors.New("logging is already set up")
	}
	opts := []klog.LoggerOption{klog.ContextualLogger(contextual)}
	switch c.Format {
	case "text":
		info, errs, _, flush := l.streams(c.Options.Text.OutputRoutingOptions, klogPriority, klogPriority)
		tc := textlogger.NewConfig(textlogger.Verbosity(int(c.Verbosity)), textlogger.Output(severityRouter{info: info, errs: errs}))
		logger := textlogger.NewLogger(tc)
		if w, ok := logger.GetSink().(textlogger.KlogBufferWriter); ok {
			// klog's printf-style calls reach the output already formatted.
			opts = append(opts, klog.WriteKlogBuffer(w.WriteKlogBuffer))
		}
		l.setV = func(v uint32) error { return tc.Verbosity().Set(strconv.FormatUint(uint64(v), 10)) }
		l.vmodule = tc.VModule()
		klog.SetLoggerWithOptions(logger, append(opts, klog.FlushLogger(flush))...)
	case "json":
		info, errs, shared, flush := l.streams(c.Options.JSON.OutputRoutingOptions, fixedPriority("<6>"), fixedPriority("<3>"))
		errStream := logsjson.AddNopSync(errs)
		if shared {
			errStream = nil // every entry to the one stream, as upstream without splitStream
		}
		logger, control := logsjson.NewJSONLogger(logsapi.VerbosityLevel(c.Verbosity), logsjson.AddNopSync(info), errStream, nil)
		l.setV = control.SetVerbosityLevel
		l.vmodule = nil
		klog.SetLoggerWithOptions(logger, append(opts, klog.FlushLogger(func() { control.Flush(); flush() }))...)
	default:
		return fmt.Errorf("logging.format: unsupported log format %q", c.Format)
	}
	klog.EnableContextualLogging(contextual)
	l.started = true
	return l.apply(c)
}

// Apply puts the live fields of c in force: verbosity, vmodule and flush frequency. It refuses, changing
// nothing, a c whose format or output options differ from those Start set up, which need a restart.
func (l *Logging) Apply(c config.LoggingConfiguration) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.started {
		return errors.New("logging is not set up yet")
	}
	if c.Format != l.running.Format {
		return fmt.Errorf("logging.format: changing %s to %s needs a restart", l.running.Format, c.Format)
	}
	for _, o := range []struct {
		path     string
		was, now config.OutputRoutingOptions
	}{
		{"logging.options.text", l.running.Options.Text.OutputRoutingOptions, c.Options.Text.OutputRoutingOptions},
		{"logging.options.json", l.running.Options.JSON.OutputRoutingOptions, c.Options.JSON.OutputRoutingOptions},
	} {
		if o.was.SplitStream != o.now.SplitStream || o.was.InfoBufferSize.Value() != o.now.InfoBufferSize.Value() {
			return fmt.Errorf("%s: changing the output streams needs a restart", o.path)
		}
	}
	return l.apply(c)
}

// SetVerbosity sets the log verbosity (klog's -v) alone.
func (l *Logging) SetVerbosity(v int) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if v < 0 {
		return fmt.Errorf("logging.verbosity: %d is negative", v)
	}
	if err := l.setVerbosity(uint32(v)); err != nil {
		return err
	}
	l.running.Verbosity = config.VerbosityLevel(v)
	return nil
}

func (l *Logging) setVerbosity(v uint32) error {
	if err := l.klogFlags.Set("v", strconv.FormatUint(uint64(v), 10)); err != nil {
		return fmt.Errorf("logging.verbosity: %w", err)
	}
	if l.setV != nil {
		if err := l.setV(v); err != nil {
			return fmt.Errorf("logging.verbosity: %w", err)
		}
	}
	return nil
}

// apply puts verbosity, vmodule and flush frequency in force and records c as running. l.mu is held.
func (l *Logging) apply(c config.LoggingConfiguration) error {
	if err := l.setVerbosity(uint32(c.Verbosity)); err != nil {
		return err
	}
	vm := vmoduleFlag(c.VModule)
	if err := l.klogFlags.Set("vmodule", vm); err != nil {
		return fmt.Errorf("logging.vmodule: %w", err)
	}
	if l.vmodule != nil {
		if err := l.vmodule.Set(vm); err != nil {
			return fmt.Errorf("logging.vmodule: %w", err)
		}
	}
	if d := c.FlushFrequency.Duration.Duration; d > 0 && d != l.flushFrequency {
		klog.StartFlushDaemon(d)
		l.flushFrequency = d
	}
	c.VModule = append(config.VModuleConfiguration(nil), c.VModule...)
	l.running = c
	return nil
}

// vmoduleFlag writes vmodule items in klog's "pattern=N,..." syntax.
func vmoduleFlag(items config.VModuleConfiguration) string {
	parts := make([]string, len(items))
	for i, it := range items {
		parts[i] = it.FilePattern + "=" + strconv.FormatUint(uint64(it.Verbosity), 10)
	}
	return strings.Join(parts, ",")
}

// streams returns where info and error entries go for the output options o: both to stderr, or info
// to stdout with splitStream, buffered when infoBufferSize is set. Streams that are the journal give each
// entry the syslog priority infoPrio or errPrio computes. shared is true when info and errs are one and
// the same writer; flush writes out the buffer.
func (l *Logging) streams(o config.OutputRoutingOptions, infoPrio, errPrio func([]byte) string) (info, errs io.Writer, shared bool, flush func()) {
	flush = func() {}
	stderrJournal := isJournal(l.stderr)
	errs = l.stderr
	if stderrJournal {
		errs = journalWriter{w: l.stderr, priority: errPrio}
	}
	if !o.SplitStream {
		if !stderrJournal {
			return l.stderr, l.stderr, true, flush
		}
		// One stream, each entry with its own priority.
		return journalWriter{w: l.stderr, priority: infoPrio}, errs, false, flush
	}
	info = l.stdout
	if isJournal(l.stdout) {
		info = journalWriter{w: l.stdout, priority: infoPrio}
	}
	if size := o.InfoBufferSize.Value(); size > 0 {
		b := newBufferedWriter(info, min(size, maxInfoBuffer))
		info, flush = b, b.Flush
	}
	return info, errs, false, flush
}

// severityRouter writes each klog text entry, which starts with its severity letter, to info (I) or to
// errs (W, E, F), as upstream's split text stream does.
type severityRouter struct{ info, errs io.Writer }

func (r severityRouter) Write(p []byte) (int, error) {
	if len(p) > 0 && p[0] == 'I' {
		return r.info.Write(p)
	}
	return r.errs.Write(p)
}

// journalWriter writes each entry behind its syslog priority ("<3>..."), which journald removes and
// records as the entry's priority.
type journalWriter struct {
	w        io.Writer
	priority func(entry []byte) string
}

func (j journalWriter) Write(p []byte) (int, error) {
	prio := j.priority(p)
	line := make([]byte, 0, len(prio)+len(p))
	line = append(append(line, prio...), p...)
	if _, err := j.w.Write(line); err != nil {
		return 0, err
	}
	return len(p), nil
}

// klogPriority is the syslog priority of a klog text entry, from its severity letter.
func klogPriority(entry []byte) string {
	if len(entry) > 0 {
		switch entry[0] {
		case 'W':
			return "<4>"
		case 'E':
			return "<3>"
		case 'F':
			return "<2>"
		}
	}
	return "<6>"
}

func fixedPriority(p string) func([]byte) string { return func([]byte) string { return p } }

// bufferedWriter holds entries in a buffer of a fixed size, written out when the next entry does not fit
// and on Flush (klog's flush daemon, every logging.flushFrequency, and klog.Flush at exit). An entry larger
// than the buffer is written directly.
type bufferedWriter struct {
	mu  sync.Mutex
	buf *bufio.Writer
	out io.Writer
}

func newBufferedWriter(out io.Writer, size int64) *bufferedWriter {
	return &bufferedWriter{buf: bufio.NewWriterSize(out, int(size)), out: out}
}

func (b *bufferedWriter) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(p) > b.buf.Available() && b.buf.Buffered() > 0 {
		if err := b.buf.Flush(); err != nil {
			return 0, err
		}
	}
	if len(p) > b.buf.Available() {
		return b.out.Write(p)
	}
	return b.buf.Write(p)
}

// Flush writes out what the buffer holds.
func (b *bufferedWriter) Flush() {
	b.mu.Lock()
	defer b.mu.Unlock()
	_ = b.buf.Flush()
}

// isJournal reports whether f is the stream JOURNAL_STREAM ("device:inode") names.
func isJournal(f *os.File) bool {
	var dev, ino uint64
	if _, err := fmt.Sscanf(os.Getenv("JOURNAL_STREAM"), "%d:%d", &dev, &ino); err != nil {
		return false
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return false
	}
	return uint64(st.Dev) == dev && uint64(st.Ino) == ino
}
