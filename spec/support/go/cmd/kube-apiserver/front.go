package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	restclient "k8s.io/client-go/rest"
)

// front is the recording front: a TLS reverse proxy on the --listen address
// that passes every API request to the API server unchanged (the client's
// own Authorization header included) and keeps a request log in the fake's
// shape, plus the control endpoints under /_fake/ and /_real/.
type front struct {
	cp       *controlPlane
	url      string
	caPEM    []byte
	server   *http.Server
	listener net.Listener
	proxy    *httputil.ReverseProxy
	maxLog   int

	writers writers

	mu  sync.Mutex
	log []*logEntry // in arrival order, as the fake's
}

type logEntry struct {
	Method      string         `json:"method"`
	Path        string         `json:"path"`
	Query       string         `json:"query"`
	ContentType string         `json:"content_type"`
	Body        *string        `json:"body"`
	BodyBase64  string         `json:"body_base64,omitempty"`
	Status      *int           `json:"status"` // null while the request is in flight
	UserAgent   string         `json:"user_agent"`
	At          float64        `json:"at"`
	Conn        string         `json:"conn"`
	Fault       map[string]any `json:"fault,omitempty"`
}

func startFront(cp *controlPlane, o *options) (*front, error) {
	target, err := url.Parse(cp.admin.Host)
	if err != nil {
		return nil, err
	}
	// The client's credentials pass through: the transport carries the API
	// server's CA and nothing else.
	anonymous := restclient.AnonymousClientConfig(cp.admin)
	transport, err := restclient.TransportFor(anonymous)
	if err != nil {
		return nil, err
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.Transport = transport
	proxy.FlushInterval = -1 // watches stream
	proxy.ErrorLog = nil

	caPEM, serving, err := servingCert()
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", o.listen)
	if err != nil {
		return nil, err
	}
	f := &front{cp: cp, caPEM: caPEM, listener: l, proxy: proxy, maxLog: o.maxLog}
	f.url = "https://" + l.Addr().String()
	f.server = &http.Server{
		Handler:   f,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{serving}, NextProtos: []string{"h2", "http/1.1"}},
		ErrorLog:  nil,
	}
	go f.server.ServeTLS(l, "", "")
	return f, nil
}

func (f *front) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	f.server.Shutdown(ctx)
}

// writeFiles writes the CA, the admin kubeconfig and, last and atomically,
// the ready file.
func (f *front) writeFiles(o *options) error {
	if o.caOut != "" {
		if err := writeAtomic(o.caOut, f.caPEM); err != nil {
			return err
		}
	}
	if o.kubeconfigOut != "" {
		kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: real
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: admin
  user:
    token: %s
contexts:
- name: real
  context:
    cluster: real
    user: admin
current-context: real
`, f.url, base64.StdEncoding.EncodeToString(f.caPEM), f.cp.token)
		if err := writeAtomic(o.kubeconfigOut, []byte(kc)); err != nil {
			return err
		}
	}
	if o.readyFile != "" {
		return writeAtomic(o.readyFile, []byte(f.url))
	}
	return nil
}

func writeAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func (f *front) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/_fake/") || strings.HasPrefix(r.URL.Path, "/_real/") {
		f.control(w, r)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	entry := logEntry{
		Method:      r.Method,
		Path:        r.URL.Path,
		Query:       r.URL.RawQuery,
		ContentType: r.Header.Get("Content-Type"),
		UserAgent:   r.UserAgent(),
		At:          float64(time.Now().UnixNano()) / 1e9,
		Conn:        r.RemoteAddr,
	}
	if len(body) > 0 {
		if utf8.Valid(body) {
			s := string(body)
			entry.Body = &s
		} else {
			entry.BodyBase64 = base64.StdEncoding.EncodeToString(body)
		}
	}
	rule := f.writers.take(r)
	// A held request is logged as it arrives, so that the requests it
	// awaits come after it in the log, as in the fake's.
	if rule != nil && rule.Await != nil {
		f.append(&entry)
		awaited := f.await(rule.Await, &entry)
		fault := map[string]any{"rule": rule.index, "action": "await"}
		if len(rule.Bump) > 0 || rule.Delete {
			fault = f.writers.act(r.Context(), f.cp.admin, rule, r.URL.Path)
		}
		fault["awaited"] = awaited
		f.mu.Lock()
		entry.Fault = fault
		f.mu.Unlock()
	} else {
		// A concurrent writer's or deleter's real write goes first, as the
		// fake's rule acts before it serves the request.
		if rule != nil {
			entry.Fault = f.writers.act(r.Context(), f.cp.admin, rule, r.URL.Path)
		}
		// Logged when it arrives, as the fake logs it, so that the log's
		// order is the order the server saw the requests in (a watch, or a
		// request held by the server, does not move behind the requests that
		// came after it); its status is filled in once the answer is known.
		f.append(&entry)
	}
	rec := &statusRecorder{ResponseWriter: w}
	f.proxy.ServeHTTP(rec, r)
	status := rec.status
	if status == 0 {
		status = http.StatusOK
	}
	f.mu.Lock()
	entry.Status = &status
	f.mu.Unlock()
}

func (f *front) append(entry *logEntry) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log = append(f.log, entry)
	if len(f.log) > f.maxLog {
		f.log = f.log[len(f.log)-f.maxLog:]
	}
}

// await holds the caller until the log has a.Count requests other than
// self that match a (true), or a.TimeoutMs has passed (false). It polls
// the log: the condition, not a guessed duration.
func (f *front) await(a *awaitRule, self *logEntry) bool {
	deadline := time.Now().Add(time.Duration(a.TimeoutMs * float64(time.Millisecond)))
	for {
		f.mu.Lock()
		seen := 0
		for _, e := range f.log {
			if e != self && (a.Method == "" || e.Method == a.Method) && a.re.MatchString(e.Path) {
				seen++
			}
		}
		f.mu.Unlock()
		if seen >= a.Count {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// control serves the endpoints the spec harness drives. Those of the fake
// that have no meaning on a real server (fault, deny and allow rules,
// compaction, token rotation) answer 501, so a spec that needs them fails
// loudly instead of passing without its fault.
func (f *front) control(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	switch {
	case r.URL.Path == "/_fake/objects" && r.Method == http.MethodGet:
		objs, err := f.cp.objects(ctx)
		if err != nil {
			controlError(w, http.StatusInternalServerError, err.Error())
			return
		}
		items := make([]map[string]any, 0, len(objs))
		for _, o := range objs {
			items = append(items, o.Object)
		}
		writeJSON(w, map[string]any{"apiVersion": "v1", "kind": "List", "items": items})
	case r.URL.Path == "/_fake/requests" && r.Method == http.MethodGet:
		f.mu.Lock()
		out := make([]logEntry, len(f.log))
		for i, e := range f.log {
			out[i] = *e
		}
		f.mu.Unlock()
		writeJSON(w, out)
	case r.URL.Path == "/_fake/requests" && r.Method == http.MethodDelete:
		f.clearLog()
		writeJSON(w, map[string]any{"cleared": true})
	case r.URL.Path == "/_fake/reset" && r.Method == http.MethodPost:
		body, err := io.ReadAll(r.Body)
		if err != nil {
			controlError(w, http.StatusBadRequest, err.Error())
			return
		}
		var texts [][]byte
		if len(bytes.TrimSpace(body)) > 0 {
			texts = [][]byte{body}
		}
		if err := f.cp.resetTo(ctx, texts); err != nil {
			var bad fixtureError
			if errors.As(err, &bad) {
				controlError(w, http.StatusBadRequest, "fixtures: "+bad.error.Error())
			} else {
				controlError(w, http.StatusInternalServerError, "reset: "+err.Error())
			}
			return
		}
		f.clearLog()
		f.clearRules()
		writeJSON(w, map[string]any{"reset": true})
	case r.URL.Path == "/_fake/faults" && r.Method == http.MethodPost:
		body, _ := io.ReadAll(r.Body)
		f.writers.mu.Lock()
		rules, err := parseWriterRules(body, len(f.writers.rules))
		if err == nil {
			f.writers.rules = append(f.writers.rules, rules...)
		}
		f.writers.mu.Unlock()
		if err != nil {
			controlError(w, http.StatusBadRequest, err.Error())
			return
		}
		writeJSON(w, map[string]any{"added": len(rules)})
	case r.URL.Path == "/_fake/faults" && r.Method == http.MethodGet:
		writeJSON(w, f.writers.listing())
	case r.URL.Path == "/_fake/faults" && r.Method == http.MethodDelete:
		f.clearRules()
		writeJSON(w, map[string]any{"cleared": true})
	case r.URL.Path == "/_real/token" && r.Method == http.MethodPost:
		f.serviceAccountToken(w, r)
	case r.URL.Path == "/_real/uids" && r.Method == http.MethodGet:
		f.cp.mu.Lock()
		writeJSON(w, f.cp.uids)
		f.cp.mu.Unlock()
	default:
		controlError(w, http.StatusNotImplemented, fmt.Sprintf("%s %s: the fake API server's control endpoint has no real counterpart (a fake-only spec)", r.Method, r.URL.Path))
	}
}

func (f *front) clearRules() {
	f.writers.mu.Lock()
	f.writers.rules = nil
	f.writers.mu.Unlock()
}

func (f *front) clearLog() {
	f.mu.Lock()
	f.log = nil
	f.mu.Unlock()
}

// serviceAccountToken mints a token through TokenRequest for
// {"namespace", "name", "expirationSeconds"}, creating the namespace and the
// account first (no controller-manager runs here to do it).
func (f *front) serviceAccountToken(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Namespace         string `json:"namespace"`
		Name              string `json:"name"`
		ExpirationSeconds int64  `json:"expirationSeconds"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Namespace == "" || req.Name == "" {
		controlError(w, http.StatusBadRequest, `want {"namespace": "...", "name": "..."}`)
		return
	}
	ctx := r.Context()
	kube := f.cp.kube
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: req.Namespace}}
	if _, err := kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		controlError(w, http.StatusInternalServerError, err.Error())
		return
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: req.Name, Namespace: req.Namespace}}
	if _, err := kube.CoreV1().ServiceAccounts(req.Namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		controlError(w, http.StatusInternalServerError, err.Error())
		return
	}
	tr := &authenticationv1.TokenRequest{}
	if req.ExpirationSeconds > 0 {
		tr.Spec.ExpirationSeconds = &req.ExpirationSeconds
	}
	got, err := kube.CoreV1().ServiceAccounts(req.Namespace).CreateToken(ctx, req.Name, tr, metav1.CreateOptions{})
	if err != nil {
		controlError(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, map[string]any{"token": got.Status.Token, "user": "system:serviceaccount:" + req.Namespace + ":" + req.Name})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

func controlError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure, Message: msg, Code: int32(code),
	})
}

// servingCert makes a CA and a serving certificate for the loopback names
// and kubernetes.default.svc (the in-cluster name, reached through a spec's
// proxy); it returns the CA in PEM and the serving pair.
func servingCert() ([]byte, tls.Certificate, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "cozy-kube-apiserver-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	return caPEM, tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
