// Command kube-apiserver runs a real Kubernetes control plane for the specs:
// etcd embedded and kube-apiserver in-process (the test server Kubernetes'
// own integration tests use), on loopback only, with RBAC authorization, the
// real KubeVirt and Flux CRDs installed, and the fake API server's fixtures
// loaded. A recording front (front.go) stands between the clients and the
// API server so that specs can read the request log as they do the fake's.
//
// Usage and the control endpoints: spec/support/README.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

type options struct {
	fixtures       stringList
	crds           stringList
	kubevirtSource string
	listen         string
	kubeconfigOut  string
	readyFile      string
	caOut          string
	token          string
	maxLog         int
	verbose        bool
}

func parseFlags(args []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("kube-apiserver", flag.ContinueOnError)
	fs.Var(&o.fixtures, "fixture", "a JSON v1 List to load at start (repeatable)")
	fs.Var(&o.crds, "crd", "a YAML file of CustomResourceDefinitions to install (repeatable)")
	fs.StringVar(&o.kubevirtSource, "kubevirt-source", "", "KubeVirt v1.9.0's module directory (its generated CRD schemas)")
	fs.StringVar(&o.listen, "listen", "127.0.0.1:0", "loopback address of the recording front")
	fs.StringVar(&o.kubeconfigOut, "kubeconfig-out", "", "write an admin kubeconfig here")
	fs.StringVar(&o.readyFile, "ready-file", "", "write the base URL here once ready")
	fs.StringVar(&o.caOut, "ca-out", "", "write the front's CA certificate (PEM) here")
	fs.StringVar(&o.token, "token", "", "the admin's bearer token (default: a random one)")
	fs.IntVar(&o.maxLog, "max-log", 200000, "keep the last N request-log entries")
	fs.BoolVar(&o.verbose, "v", false, "log the API server's own messages to stderr")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if !isLoopback(o.listen) {
		return nil, fmt.Errorf("--listen %q: only loopback addresses are allowed", o.listen)
	}
	return o, nil
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "kube-apiserver:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "kube-apiserver:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o *options) error {
	started := time.Now()
	cp, err := startControlPlane(ctx, o)
	if err != nil {
		return err
	}
	defer cp.stop()

	if err := installCRDs(ctx, cp, o.crds); err != nil {
		return fmt.Errorf("installing CRDs: %w", err)
	}
	if err := cp.takeBaseline(ctx); err != nil {
		return fmt.Errorf("recording the baseline: %w", err)
	}
	if len(o.fixtures) > 0 {
		var lists [][]byte
		for _, f := range o.fixtures {
			data, err := os.ReadFile(f)
			if err != nil {
				return err
			}
			lists = append(lists, data)
		}
		if err := cp.load(ctx, lists); err != nil {
			return fmt.Errorf("loading fixtures: %w", err)
		}
	}

	front, err := startFront(cp, o)
	if err != nil {
		return err
	}
	defer front.close()
	if err := front.writeFiles(o); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "kube-apiserver: ready at %s after %.1fs\n", front.url, time.Since(started).Seconds())
	<-ctx.Done()
	return nil
}
