"""Fault rules (POST /_fake/faults): checked before any is installed, so that a
rule the server would not act on (a typo, a regex where a method belongs) is
refused instead of silently doing nothing; matched against each request; and
acted on (a status, a reset, a concurrent writer or deleter, a canned answer, a
misleading continue token, a rotated token, a delay, an await)."""

import json
import re
import time

from fakeapi.errors import ApiError
from fakeapi.patching import merge_patch
from fakeapi.reads import encode_continue
from fakeapi.util import deep, dumps, write_atomic

# The reason client-go's NewGenericServerResponse gives each code (fault rules default to it).
DEFAULT_REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound",
                   405: "MethodNotAllowed", 406: "NotAcceptable", 409: "Conflict", 410: "Gone",
                   415: "UnsupportedMediaType", 422: "Invalid", 429: "TooManyRequests",
                   500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout"}


HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
# the actions a rule takes; delay_ms is not among them because it may go with one
FAULT_ACTIONS = ("status", "reset", "bump", "delete", "respond", "continue", "rotate_token")
FAULT_KEYS = ("method", "path", "times", "skip", "delay_ms", "await") + FAULT_ACTIONS
AWAIT_KEYS = ("method", "path", "count", "timeout_ms")
STATUS_KEYS = ("code", "reason", "message", "retry_after")
RESPOND_KEYS = ("status", "body", "content_type")
ROTATE_KEYS = ("token", "file")
CONTINUE_MODES = ("repeat", "rewind")


class FaultRuleError(Exception):
    pass


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v):
    return (isinstance(v, (int, float)) and not isinstance(v, bool))


def header_safe(s):
    return not any(c in s for c in "\r\n\0")


def check_fault_rule(r):
    """Raises FaultRuleError naming what is wrong with one rule."""
    if not isinstance(r, dict):
        raise FaultRuleError("a fault rule must be a JSON object, got %s" % json.dumps(r))
    unknown = sorted(k for k in r if k not in FAULT_KEYS)
    if unknown:
        raise FaultRuleError("unknown key%s %s (a rule has: %s)" % (
            "s" if len(unknown) > 1 else "", ", ".join('"%s"' % k for k in unknown), ", ".join(FAULT_KEYS)))
    if "method" in r and r["method"] not in HTTP_METHODS:
        raise FaultRuleError("method %s is not an HTTP method (one of %s; omit it to match any)" % (
            json.dumps(r["method"]), ", ".join(HTTP_METHODS)))
    if "path" in r:
        if not isinstance(r["path"], str):
            raise FaultRuleError("path must be a string (a regex), got %s" % json.dumps(r["path"]))
        try:
            re.compile(r["path"])
        except re.error as e:
            raise FaultRuleError("path %s is not a valid regex: %s" % (json.dumps(r["path"]), e))
    if "times" in r and not (is_int(r["times"]) and (r["times"] >= 1 or r["times"] == -1)):
        raise FaultRuleError("times must be a positive integer or -1 (forever), got %s" % json.dumps(r["times"]))
    if "skip" in r and not (is_int(r["skip"]) and r["skip"] >= 0):
        raise FaultRuleError("skip must be a non-negative integer, got %s" % json.dumps(r["skip"]))
    if "delay_ms" in r and not (is_number(r["delay_ms"]) and r["delay_ms"] > 0):
        raise FaultRuleError("delay_ms must be a positive number, got %s" % json.dumps(r["delay_ms"]))
    if "await" in r:
        check_await(r["await"])
    check_actions(r)


def check_actions(r):
    """The one action of rule r (and delay_ms, await), each checked."""
    actions = [a for a in FAULT_ACTIONS if a in r]
    if len(actions) > 1:
        raise FaultRuleError("two actions in one rule (%s): give one, in separate rules if need be" %
                             ", ".join(actions))
    if not actions and "delay_ms" not in r and "await" not in r:
        raise FaultRuleError("no action: give one of %s (or delay_ms, await)" % ", ".join(FAULT_ACTIONS))
    if "status" in r:
        check_status(r["status"])
    for k in ("reset", "delete"):
        if k in r and r[k] is not True:
            raise FaultRuleError("%s must be true, got %s" % (k, json.dumps(r[k])))
    if "bump" in r:
        b = r["bump"]
        if not (b is True or (isinstance(b, dict) and list(b) == ["merge"] and isinstance(b["merge"], dict))):
            raise FaultRuleError('bump must be true or {"merge": {...}}, got %s' % json.dumps(b))
    if "respond" in r:
        check_respond(r["respond"])
    if "rotate_token" in r:
        check_rotate_token(r["rotate_token"])
    if "continue" in r and r["continue"] not in CONTINUE_MODES:
        raise FaultRuleError("continue must be one of %s, got %s" % (
            ", ".join('"%s"' % m for m in CONTINUE_MODES), json.dumps(r["continue"])))


def check_keys(name, value, keys):
    """An action's object: a dict whose keys are among `keys`; raises the
    rule's error naming them otherwise."""
    if not isinstance(value, dict):
        raise FaultRuleError("%s must be an object {%s}, got %s" % (name, ", ".join(keys), json.dumps(value)))
    unknown = sorted(k for k in value if k not in keys)
    if unknown:
        raise FaultRuleError("unknown key%s in %s: %s (%s has: %s)" % (
            "s" if len(unknown) > 1 else "", name, ", ".join('"%s"' % k for k in unknown), name, ", ".join(keys)))


def check_status(s):
    """A status action: a code, or {code, reason, message, retry_after}."""
    if is_int(s):
        s = {"code": s}
    if not isinstance(s, dict):
        raise FaultRuleError("status must be a code or an object {%s}, got %s" % (
            ", ".join(STATUS_KEYS), json.dumps(s)))
    check_keys("status", s, STATUS_KEYS)
    if "code" in s and not (is_int(s["code"]) and 100 <= s["code"] <= 599):
        raise FaultRuleError("status.code must be an integer from 100 to 599, got %s" % json.dumps(s["code"]))
    for k in ("reason", "message"):
        if k in s and not isinstance(s[k], str):
            raise FaultRuleError("status.%s must be a string, got %s" % (k, json.dumps(s[k])))
    if "retry_after" in s and not (is_int(s["retry_after"]) and s["retry_after"] >= 0):
        raise FaultRuleError("status.retry_after must be a non-negative integer (seconds), got %s" %
                             json.dumps(s["retry_after"]))


def check_respond(a):
    """A respond action: {status, body, content_type}, sent as given."""
    check_keys("respond", a, RESPOND_KEYS)
    if "status" in a and not (is_int(a["status"]) and 100 <= a["status"] <= 599):
        raise FaultRuleError("respond.status must be an integer from 100 to 599, got %s" % json.dumps(a["status"]))
    if "content_type" in a and not (isinstance(a["content_type"], str) and a["content_type"]
                                    and header_safe(a["content_type"])):
        raise FaultRuleError("respond.content_type must be a non-empty header value, got %s" %
                             json.dumps(a["content_type"]))


def check_rotate_token(t):
    """A rotate_token action: {token[, file]}."""
    check_keys("rotate_token", t, ROTATE_KEYS)
    if not (isinstance(t.get("token"), str) and t["token"] and header_safe(t["token"])):
        raise FaultRuleError("rotate_token.token must be a non-empty header value, got %s" %
                             json.dumps(t.get("token")))
    if "file" in t and not (isinstance(t["file"], str) and t["file"]):
        raise FaultRuleError("rotate_token.file must be a path, got %s" % json.dumps(t["file"]))


def check_await(a):
    """An await holds the request until the log has `count` requests matching
    `method` (any when absent) and `path` (a regex searched in the decoded path),
    or until `timeout_ms` has passed."""
    check_keys("await", a, AWAIT_KEYS)
    if "method" in a and a["method"] not in HTTP_METHODS:
        raise FaultRuleError("await.method %s is not an HTTP method" % json.dumps(a["method"]))
    if not isinstance(a.get("path"), str):
        raise FaultRuleError("await.path must be a string (a regex), got %s" % json.dumps(a.get("path")))
    try:
        re.compile(a["path"])
    except re.error as e:
        raise FaultRuleError("await.path %s is not a valid regex: %s" % (json.dumps(a["path"]), e))
    if not (is_int(a.get("count")) and a["count"] >= 1):
        raise FaultRuleError("await.count must be a positive integer, got %s" % json.dumps(a.get("count")))
    if not (is_number(a.get("timeout_ms")) and a["timeout_ms"] > 0):
        raise FaultRuleError("await.timeout_ms must be a positive number, got %s" % json.dumps(a.get("timeout_ms")))


def fault_action(rule):
    for a in FAULT_ACTIONS:
        if a in rule:
            return a
    return "await" if "await" in rule else "delay"


def prepare_fault_rules(rules, base):
    """The rules of one POST, ready to install, or FaultRuleError for the first bad one."""
    if isinstance(rules, dict):
        rules = [rules]
    if not isinstance(rules, list):
        raise FaultRuleError("fault rules must be a JSON array of rules or one rule object")
    prepared = []
    for i, r in enumerate(rules):
        try:
            check_fault_rule(r)
        except FaultRuleError as e:
            raise FaultRuleError("fault rule %d of this request: %s; no rule of it was added" % (i, e))
        r = dict(r)
        r["_re"] = re.compile(r.get("path") or "")
        r["_skip"] = r.get("skip", 0)
        r["left"] = r.get("times", 1)
        r["fired"] = 0
        r["index"] = base + i
        prepared.append(r)
    return prepared


def injected_status(s):
    """The ApiError a status action answers with (a code alone, or an object)."""
    if isinstance(s, int):
        s = {"code": s}
    code = int(s.get("code", 500))
    reason = s.get("reason") or DEFAULT_REASONS.get(code) or \
        ("InternalError" if code >= 500 else "Unknown")
    h = {}
    details = {}
    if s.get("retry_after") is not None:
        h["Retry-After"] = str(s["retry_after"])
        details["retryAfterSeconds"] = int(s["retry_after"])
    return ApiError(code, reason, s.get("message") or "injected fault", details, headers=h)


class FaultsMixin:
    """The Handler's side of the fault rules (fakeapi.server.Handler): which rule a
    request takes, and what each action does to it."""

    def apply_fault(self, rule, req, entry):
        """Acts on the rule a request took, before it is served. Returns True when
        the request has been answered (reset, respond); raises ApiError for a
        status or a rotated token; otherwise the request goes on to the API."""
        if rule.get("await"):
            entry["fault"]["awaited"] = self.await_requests(rule["await"], entry)
        if rule.get("delay_ms"):
            time.sleep(rule["delay_ms"] / 1000.0)
        if rule.get("reset"):
            entry["status"] = 0
            self.drop()
            return True
        if rule.get("status") is not None:
            raise injected_status(rule["status"])
        if rule.get("rotate_token") is not None:
            self.rotate_token(rule["rotate_token"], entry)
            raise ApiError(401, "Unauthorized", "Unauthorized")
        if rule.get("respond") is not None:
            code, headers, out = self.canned(rule["respond"])
            entry["status"] = code
            self.send(code, headers, b"" if self.command == "HEAD" else out)
            return True
        if rule.get("bump"):
            self.bump(req, rule, entry)
        if rule.get("delete"):
            self.vanish(req, entry)
        return False

    def await_requests(self, spec, entry):
        """Holds this request until the log has spec["count"] other requests that
        match spec's method and path (True), or spec["timeout_ms"] has passed
        (False). Polls the log: the condition, not a guessed duration."""
        state = self.server.state
        pattern = re.compile(spec["path"])
        deadline = time.monotonic() + spec["timeout_ms"] / 1000.0
        while True:
            with state.lock:
                seen = sum(1 for e in state.log if e is not entry
                           and (not spec.get("method") or e["method"] == spec["method"])
                           and pattern.search(e["path"]))
            if seen >= spec["count"]:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)

    def take_fault(self, req, entry):
        state = self.server.state
        with state.lock:
            for rule in state.faults:
                if rule["left"] == 0:
                    continue
                if rule.get("method") and rule["method"].upper() != req.method:
                    continue
                if rule.get("path") and not rule["_re"].search(req.target):
                    continue
                if rule["_skip"] > 0:   # a matching request let through untouched
                    rule["_skip"] -= 1
                    continue
                if rule["left"] > 0:
                    rule["left"] -= 1
                rule["fired"] += 1
                entry["fault"] = {"action": fault_action(rule), "rule": rule["index"]}
                return rule
        return None

    @staticmethod
    def canned(spec):
        """The answer of a respond rule: exactly the status, body and content type given
        (a string body is sent as it is, anything else as JSON)."""
        body = spec.get("body")
        if body is None and "body" not in spec:
            out = b""
        elif isinstance(body, str):
            out = body.encode("utf-8")
        else:
            out = dumps(body)
        return spec.get("status", 200), {"Content-Type": spec.get("content_type", "application/json")}, out

    @staticmethod
    def misdirect(req, mode, code, out, entry):
        """A list answer with a continue token that leads nowhere: "repeat" hands back
        the token the request came with (a client that follows it reads the same page
        forever); "rewind" hands out a valid token that points before the first object
        (a client that follows it reads the objects it has already seen)."""
        entry["fault"]["applied"] = False
        if code != 200:
            return out
        try:
            body = json.loads(out)
        except ValueError:
            return out
        if not (isinstance(body, dict) and str(body.get("kind", "")).endswith("List")
                and isinstance(body.get("metadata"), dict)):
            return out
        meta = body["metadata"]
        if mode == "repeat":
            token = req.q("continue")
            if not token:
                return out
        else:
            rv = meta.get("resourceVersion")
            token = encode_continue(int(rv) if str(rv).isdigit() else -1, "")
        meta["continue"] = token
        meta.pop("remainingItemCount", None)
        entry["fault"]["applied"] = True
        entry["fault"]["continue"] = token
        return dumps(body)

    def rotate_token(self, spec, entry):
        """The token this request carries expires: from now on only spec["token"] is
        accepted, and it is written to spec["file"] (as the kubelet rotates a projected
        service account token) before the 401 goes out."""
        srv = self.server
        with srv.state.lock:
            if spec.get("file"):
                write_atomic(spec["file"], spec["token"] + "\n")
            srv.token = spec["token"]
        entry["fault"]["applied"] = True

    def bump(self, req, rule, entry):
        """A concurrent writer: changes the target object's resourceVersion (and, if the
        rule gives a merge patch, its content) before this request is served."""
        api = self.server.api
        state = self.server.state
        try:
            r = api.route(req)
        except ApiError:
            r = None
        with state.lock:
            if not r or r[0] != "resource" or r[4] is None:
                entry["fault"]["applied"] = False
                return
            _, rt, _, ns, name, _, _ = r
            bucket = state.objects.get((rt.group, rt.plural), {})
            o = bucket.get((ns or "", name))
            if o is None:
                entry["fault"]["applied"] = False
                return
            new = deep(o)
            if isinstance(rule["bump"], dict) and isinstance(rule["bump"].get("merge"), dict):
                new = merge_patch(new, rule["bump"]["merge"])
                new["metadata"]["uid"] = o["metadata"].get("uid")
            new["metadata"]["resourceVersion"] = state.next_rv()
            bucket[(ns or "", name)] = new
            state.notify(rt, "MODIFIED", new)
            entry["fault"]["applied"] = True
            entry["fault"]["resourceVersion"] = new["metadata"]["resourceVersion"]

    def vanish(self, req, entry):
        """A concurrent deleter: the target object is gone (finalizers and all, as
        after a completed deletion) before this request is served."""
        api = self.server.api
        state = self.server.state
        try:
            r = api.route(req)
        except ApiError:
            r = None
        with state.lock:
            if not r or r[0] != "resource" or r[4] is None:
                entry["fault"]["applied"] = False
                return
            _, rt, _, ns, name, _, _ = r
            bucket = state.objects.get((rt.group, rt.plural), {})
            o = bucket.pop((ns or "", name), None)
            if o is None:
                entry["fault"]["applied"] = False
                return
            gone = deep(o)
            gone["metadata"]["resourceVersion"] = state.next_rv()
            state.notify(rt, "DELETED", gone)
            entry["fault"]["applied"] = True
