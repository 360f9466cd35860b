package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	restclient "k8s.io/client-go/rest"
)

var noConversionCodecs = scheme.Codecs.WithoutConversion()

// The fake's fault rules of the kinds a real server can play honestly: a
// concurrent writer (`bump`) and a concurrent deleter (`delete`), each a
// real write through the API, made by the admin just before the matching
// request is passed on, so the real server judges what the request then
// meets (a 409, a failed test, a 404); and `await`, which holds the request
// until the log has the requests it names (the server still answers it).
// Every other action (status, reset, respond, continue, rotate_token,
// delay_ms) is refused: it would be the front speaking, not the server.
//
// A bump that gives no merge patch changes the annotation
// cozy-migrate.test/bump (a real server bumps resourceVersion only when
// something changes); a merge that touches `status` is sent to the status
// subresource, the rest to the object.
type writerRule struct {
	Method string          `json:"method,omitempty"`
	Path   string          `json:"path,omitempty"`
	Times  *int            `json:"times,omitempty"`
	Skip   int             `json:"skip,omitempty"`
	Bump   json.RawMessage `json:"bump,omitempty"`
	Delete bool            `json:"delete,omitempty"`
	Await  *awaitRule      `json:"await,omitempty"`

	re      *regexp.Regexp
	merge   map[string]any
	left    int
	skipped int
	fired   int
	index   int
}

// awaitRule holds a request until the front's log has Count other requests
// matching Method (any when empty) and Path (a regex searched in the path),
// or TimeoutMs has passed.
type awaitRule struct {
	Method    string  `json:"method,omitempty"`
	Path      string  `json:"path"`
	Count     int     `json:"count"`
	TimeoutMs float64 `json:"timeout_ms"`

	re *regexp.Regexp
}

type writers struct {
	mu    sync.Mutex
	rules []*writerRule
	bumps int
}

var writerMethods = map[string]bool{"GET": true, "HEAD": true, "POST": true, "PUT": true, "PATCH": true, "DELETE": true, "OPTIONS": true}

// parseWriterRules reads a JSON array of rules (or one rule); a rule the
// front would not act on is refused whole, as the fake refuses it.
func parseWriterRules(body []byte, first int) ([]*writerRule, error) {
	var raws []json.RawMessage
	if err := json.Unmarshal(body, &raws); err != nil {
		var one json.RawMessage
		if err := json.Unmarshal(body, &one); err != nil {
			return nil, fmt.Errorf("not a JSON array of rules: %v", err)
		}
		raws = []json.RawMessage{one}
	}
	var out []*writerRule
	for i, raw := range raws {
		var keys map[string]json.RawMessage
		if err := json.Unmarshal(raw, &keys); err != nil {
			return nil, fmt.Errorf("rule %d: not an object", i)
		}
		for k := range keys {
			switch k {
			case "method", "path", "times", "skip", "bump", "delete", "await":
			case "status", "reset", "respond", "continue", "rotate_token", "delay_ms":
				return nil, fmt.Errorf("rule %d: %q is a fault only the fake API server can play (a fake-only spec)", i, k)
			default:
				return nil, fmt.Errorf("rule %d: unknown key %q", i, k)
			}
		}
		r := &writerRule{}
		dec := json.NewDecoder(strings.NewReader(string(raw)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(r); err != nil {
			return nil, fmt.Errorf("rule %d: %v", i, err)
		}
		if r.Method != "" && !writerMethods[r.Method] {
			return nil, fmt.Errorf("rule %d: method %q is not one of GET HEAD POST PUT PATCH DELETE OPTIONS", i, r.Method)
		}
		re, err := regexp.Compile(r.Path)
		if err != nil {
			return nil, fmt.Errorf("rule %d: path %q is not a valid regex: %v", i, r.Path, err)
		}
		r.re = re
		r.left = 1
		if r.Times != nil {
			if *r.Times < 1 && *r.Times != -1 {
				return nil, fmt.Errorf("rule %d: times must be a positive integer or -1 (forever)", i)
			}
			r.left = *r.Times
		}
		if r.Skip < 0 {
			return nil, fmt.Errorf("rule %d: skip must be a non-negative integer", i)
		}
		bump := len(r.Bump) > 0
		if bump && r.Delete || !bump && !r.Delete && r.Await == nil {
			return nil, fmt.Errorf("rule %d: give one action, bump or delete (or await)", i)
		}
		if a := r.Await; a != nil {
			if a.Method != "" && !writerMethods[a.Method] {
				return nil, fmt.Errorf("rule %d: await.method %q is not an HTTP method", i, a.Method)
			}
			if a.re, err = regexp.Compile(a.Path); err != nil || a.Path == "" {
				return nil, fmt.Errorf("rule %d: await.path must be a valid regex", i)
			}
			if a.Count < 1 {
				return nil, fmt.Errorf("rule %d: await.count must be a positive integer", i)
			}
			if a.TimeoutMs <= 0 {
				return nil, fmt.Errorf("rule %d: await.timeout_ms must be a positive number", i)
			}
		}
		if _, given := keys["delete"]; given && !r.Delete {
			return nil, fmt.Errorf("rule %d: delete must be true", i)
		}
		if bump && string(r.Bump) != "true" {
			var b struct {
				Merge map[string]any `json:"merge"`
			}
			if err := json.Unmarshal(r.Bump, &b); err != nil || b.Merge == nil {
				return nil, fmt.Errorf(`rule %d: bump must be true or {"merge": {...}}`, i)
			}
			r.merge = b.Merge
		}
		r.index = first + i
		out = append(out, r)
	}
	return out, nil
}

// take returns the first rule with times left that matches the request, and
// uses one of its times.
func (w *writers) take(r *http.Request) *writerRule {
	w.mu.Lock()
	defer w.mu.Unlock()
	target := r.URL.RequestURI()
	for _, rule := range w.rules {
		if rule.left == 0 || (rule.Method != "" && rule.Method != r.Method) || !rule.re.MatchString(target) {
			continue
		}
		if rule.skipped < rule.Skip {
			rule.skipped++
			continue
		}
		if rule.left > 0 {
			rule.left--
		}
		rule.fired++
		return rule
	}
	return nil
}

// act makes the rule's real write to the object the request names, and
// says what it did for the request log.
func (w *writers) act(ctx context.Context, admin *restclient.Config, rule *writerRule, path string) map[string]any {
	fault := map[string]any{"rule": rule.index}
	client, err := restclient.UnversionedRESTClientFor(withCodec(admin))
	if err != nil {
		fault["applied"], fault["error"] = false, err.Error()
		return fault
	}
	path = strings.TrimSuffix(path, "/status")
	if rule.Delete {
		fault["action"] = "delete"
		// finalizers ignored, as after a completed deletion
		client.Patch(types.MergePatchType).AbsPath(path).Body([]byte(`{"metadata":{"finalizers":null}}`)).Do(ctx)
		err := client.Delete().AbsPath(path).Do(ctx).Error()
		fault["applied"] = err == nil
		if err != nil && !apierrors.IsNotFound(err) {
			fault["error"] = err.Error()
		}
		return fault
	}
	fault["action"] = "bump"
	merge := rule.merge
	if merge == nil {
		w.mu.Lock()
		w.bumps++
		n := w.bumps
		w.mu.Unlock()
		merge = map[string]any{"metadata": map[string]any{"annotations": map[string]any{"cozy-migrate.test/bump": fmt.Sprint(n)}}}
	}
	var result []byte
	if status, ok := merge["status"]; ok {
		body, _ := json.Marshal(map[string]any{"status": status})
		result, err = client.Patch(types.MergePatchType).AbsPath(path, "status").Body(body).Do(ctx).Raw()
		if err != nil {
			fault["applied"], fault["error"] = false, err.Error()
			return fault
		}
	}
	rest := map[string]any{}
	for k, v := range merge {
		if k != "status" {
			rest[k] = v
		}
	}
	if len(rest) > 0 {
		body, _ := json.Marshal(rest)
		result, err = client.Patch(types.MergePatchType).AbsPath(path).Body(body).Do(ctx).Raw()
		if err != nil {
			fault["applied"] = false
			if !apierrors.IsNotFound(err) {
				fault["error"] = err.Error()
			}
			return fault
		}
	}
	var obj struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
	}
	if err := json.Unmarshal(result, &obj); err != nil {
		fault["answer"] = truncate(string(result), 200)
	}
	fault["applied"] = true
	fault["resourceVersion"] = obj.Metadata.ResourceVersion
	return fault
}

func withCodec(c *restclient.Config) *restclient.Config {
	c = restclient.CopyConfig(c)
	c.NegotiatedSerializer = noConversionCodecs
	// the test server's loopback config asks for protobuf
	c.ContentType, c.AcceptContentTypes = "application/json", "application/json"
	return c
}

// listing returns the rules with what is left of each, for GET /_fake/faults.
func (w *writers) listing() []map[string]any {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := []map[string]any{}
	for _, r := range w.rules {
		out = append(out, map[string]any{"rule": r.index, "method": r.Method, "path": r.Path, "left": r.left, "fired": r.fired})
	}
	return out
}
