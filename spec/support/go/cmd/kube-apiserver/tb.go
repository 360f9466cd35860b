package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

// programTB is the testing.TB that Kubernetes' test server asks for, in a
// program that is not a test: logs go to stderr with -v, a fatal error ends
// the program, and cleanups run when the control plane stops.
type programTB struct {
	dir      string
	verbose  bool
	mu       sync.Mutex
	cleanups []func()
	failed   bool
	temps    int
}

func newProgramTB(dir string, verbose bool) *programTB {
	return &programTB{dir: dir, verbose: verbose}
}

func (t *programTB) Cleanup(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cleanups = append(t.cleanups, f)
}

func (t *programTB) cleanup() {
	t.mu.Lock()
	fs := t.cleanups
	t.cleanups = nil
	t.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}

func (t *programTB) Error(args ...any)                 { t.Log(args...); t.Fail() }
func (t *programTB) Errorf(format string, args ...any) { t.Logf(format, args...); t.Fail() }
func (t *programTB) Fail()                             { t.mu.Lock(); t.failed = true; t.mu.Unlock() }
func (t *programTB) FailNow() {
	fmt.Fprintln(os.Stderr, "kube-apiserver: the test server failed")
	os.Exit(1)
}
func (t *programTB) Failed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.failed
}
func (t *programTB) Fatal(args ...any) {
	fmt.Fprintln(os.Stderr, append([]any{"kube-apiserver:"}, args...)...)
	os.Exit(1)
}
func (t *programTB) Fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "kube-apiserver: "+format+"\n", args...)
	os.Exit(1)
}
func (t *programTB) Helper() {}
func (t *programTB) Log(args ...any) {
	if t.verbose {
		fmt.Fprintln(os.Stderr, args...)
	}
}
func (t *programTB) Logf(format string, args ...any) {
	if t.verbose {
		fmt.Fprintf(os.Stderr, format+"\n", args...)
	}
}
func (t *programTB) Name() string                     { return "cozy-kube-apiserver" }
func (t *programTB) Setenv(key, value string)         { os.Setenv(key, value) }
func (t *programTB) Skip(args ...any)                 { t.Fatal(append([]any{"skip:"}, args...)...) }
func (t *programTB) SkipNow()                         { t.Fatal("skip") }
func (t *programTB) Skipf(format string, args ...any) { t.Fatalf("skip: "+format, args...) }
func (t *programTB) Skipped() bool                    { return false }
func (t *programTB) TempDir() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.temps++
	d := filepath.Join(t.dir, fmt.Sprintf("tmp%d", t.temps))
	if err := os.MkdirAll(d, 0o700); err != nil {
		t.Fatalf("%v", err)
	}
	return d
}
