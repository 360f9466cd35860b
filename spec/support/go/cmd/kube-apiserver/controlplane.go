package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"go.etcd.io/etcd/server/v3/embed"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	restclient "k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	kubeapiservertesting "k8s.io/kubernetes/cmd/kube-apiserver/app/testing"
)

// AdminUser is the user of the admin token: a member of system:masters, as a
// cluster's admin.conf is.
const AdminUser = "admin"

type controlPlane struct {
	dir            string
	etcd           *embed.Etcd
	server         kubeapiservertesting.TestServer
	tb             *programTB
	admin          *restclient.Config // the API server directly, with the admin token
	token          string
	kube           kubernetes.Interface
	dyn            dynamic.Interface
	disco          *discovery.DiscoveryClient
	ext            apiextensionsclient.Interface
	baseline       map[string]string // key -> resourceVersion of what exists before any fixture: never reset
	mu             sync.Mutex        // serialises load and reset
	uidMu          sync.Mutex        // guards uids and loaded while a load creates objects in parallel
	uids           map[string]string
	loaded         []loaded                                    // what the last load made, for the next reset
	loadedFixture  []string                                    // the fixture it loaded (canonical), nil when a reset did not complete
	kubevirtSource string                                      // KubeVirt's module source, for its generated CRD schemas
	realCRDs       map[string]bool                             // names of the CRDs installed at start: a fixture's own give way
	realCRDList    []*apiextensionsv1.CustomResourceDefinition // re-created by a reset when a spec deleted one
}

func startControlPlane(ctx context.Context, o *options) (*controlPlane, error) {
	if !o.verbose {
		// The test server's own complaints (no controller-manager, no
		// kube-system namespace yet) are noise to a spec; -v shows them.
		klog.SetLogger(logr.Discard())
	}
	dir, err := os.MkdirTemp("", "cozy-kube-apiserver-")
	if err != nil {
		return nil, err
	}
	cp := &controlPlane{dir: dir, tb: newProgramTB(dir, o.verbose), uids: map[string]string{}, kubevirtSource: o.kubevirtSource}
	ok := false
	defer func() {
		if !ok {
			cp.stop()
		}
	}()

	etcdURL, err := cp.startEtcd()
	if err != nil {
		return nil, fmt.Errorf("starting etcd: %w", err)
	}

	cp.token = o.token
	if cp.token == "" {
		cp.token = randomToken()
	}
	tokenFile := filepath.Join(dir, "tokens.csv")
	// token,user,uid,"group1,group2"
	line := fmt.Sprintf("%s,%s,%s,\"system:masters\"\n", cp.token, AdminUser, AdminUser)
	if err := os.WriteFile(tokenFile, []byte(line), 0o600); err != nil {
		return nil, err
	}

	storage := storagebackend.NewDefaultConfig("/registry", nil)
	storage.Transport.ServerList = []string{etcdURL}
	flags := []string{
		"--authorization-mode=RBAC",
		"--token-auth-file=" + tokenFile,
		"--bind-address=127.0.0.1",
		"--endpoint-reconciler-type=none",
	}
	server, err := kubeapiservertesting.StartTestServer(cp.tb, kubeapiservertesting.NewDefaultTestServerOptions(), flags, storage)
	if err != nil {
		return nil, fmt.Errorf("starting kube-apiserver: %w", err)
	}
	cp.server = server

	admin := restclient.CopyConfig(server.ClientConfig)
	admin.BearerToken = cp.token
	admin.BearerTokenFile = ""
	admin.QPS, admin.Burst = 1000, 2000
	admin.UserAgent = "cozy-kube-apiserver"
	cp.admin = admin
	if cp.kube, err = kubernetes.NewForConfig(admin); err != nil {
		return nil, err
	}
	if cp.dyn, err = dynamic.NewForConfig(admin); err != nil {
		return nil, err
	}
	if cp.disco, err = discovery.NewDiscoveryClientForConfig(admin); err != nil {
		return nil, err
	}
	if cp.ext, err = apiextensionsclient.NewForConfig(admin); err != nil {
		return nil, err
	}
	ok = true
	return cp, nil
}

// startEtcd runs etcd embedded on two free loopback ports, its data in the
// control plane's temporary directory.
func (cp *controlPlane) startEtcd() (string, error) {
	ports, err := freePorts(2)
	if err != nil {
		return "", err
	}
	cfg := embed.NewConfig()
	cfg.Dir = filepath.Join(cp.dir, "etcd")
	cfg.Logger = "zap"
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{filepath.Join(cp.dir, "etcd.log")}
	client := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[0])}
	peer := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[1])}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	// Tests want writes now, not durability across a power cut.
	cfg.UnsafeNoFsync = true
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return "", err
	}
	cp.etcd = e
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		return "", fmt.Errorf("etcd was not ready within 60s")
	}
	return client.String(), nil
}

func (cp *controlPlane) stop() {
	if cp.server.TearDownFn != nil {
		cp.server.TearDownFn()
	}
	if cp.etcd != nil {
		cp.etcd.Close()
	}
	cp.tb.cleanup()
	os.RemoveAll(cp.dir)
}

func freePorts(n int) ([]int, error) {
	var ports []int
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		listeners = append(listeners, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func randomToken() string {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

func isLoopback(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
