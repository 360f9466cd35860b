"""Routing: a request's path and method to the discovery document, resource
type, version, namespace, name and subresource it names, and to the verb that
serves it (the Api class, whose verbs live in the mixins it is made of)."""

import urllib.parse

from fakeapi.apply import ApplyMixin
from fakeapi.discovery import DiscoveryMixin
from fakeapi.errors import ApiError, MSG_METHOD, PageNotFound, err_forbidden, err_not_found_path
from fakeapi.reads import ReadsMixin
from fakeapi.resources import builtin_group, versioned
from fakeapi.reviews import ReviewsMixin
from fakeapi.util import dumps
from fakeapi.writes import WritesMixin


SERVER_VERSION = {
    "major": "1", "minor": "32", "gitVersion": "v1.32.0-fake",
    "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.23.0", "compiler": "gc",
    "platform": "linux/amd64",
}


def impersonation(headers):
    """The Impersonate-* headers as kube-apiserver reads them (its
    WithImpersonation filter): user, uid, each group, and extra, whose keys
    are lowercased, then unescaped. None when no header asks for it."""
    user = headers.get("Impersonate-User")
    uid = headers.get("Impersonate-Uid")
    groups = headers.get_all("Impersonate-Group") or []
    extra = {}
    for name in list(headers.keys()):
        if name.lower().startswith("impersonate-extra-"):
            key = urllib.parse.unquote(name[len("impersonate-extra-"):].lower())
            extra.setdefault(key, []).extend(headers.get_all(name) or [headers.get(name)])
    if user is None and uid is None and not groups and not extra:
        return None
    out = {"user": user, "groups": groups, "extra": extra}
    if uid is not None:
        out["uid"] = uid
    return out


class Request:
    __slots__ = ("method", "path", "query", "content_type", "body", "accept", "target", "impersonate")

    def __init__(self, method, target, headers, body):
        self.method = method
        self.target = target
        parsed = urllib.parse.urlsplit(target)
        self.path = urllib.parse.unquote(parsed.path)
        self.query = urllib.parse.parse_qs(parsed.query, keep_blank_values=True)
        self.content_type = (headers.get("Content-Type") or "").split(";")[0].strip().lower()
        self.accept = headers.get("Accept") or ""
        self.body = body
        self.impersonate = impersonation(headers)

    def q(self, name, default=None):
        v = self.query.get(name)
        return v[0] if v else default


class Api(DiscoveryMixin, ReadsMixin, WritesMixin, ApplyMixin, ReviewsMixin):
    """Pure functions of (state, request) -> (code, headers, body bytes): the
    routing here, the verbs in the mixins (fakeapi.discovery, reads, writes,
    apply, reviews)."""

    def __init__(self, state, base_url_fn):
        self.state = state
        self.base_url = base_url_fn

    # -- routing -------------------------------------------------------------
    def route(self, req):
        """Returns (rt, version, namespace, name, subresource) or a discovery tuple."""
        parts = [p for p in req.path.split("/") if p]
        if not parts:
            raise err_not_found_path()
        if parts[0] == "api":
            group = ""
            if len(parts) == 1:
                return ("discovery", "api")
            version, rest = parts[1], parts[2:]
        elif parts[0] == "apis":
            if len(parts) == 1:
                return ("discovery", "apis")
            group = parts[1]
            if len(parts) == 2:
                return ("discovery", "group", group)
            version, rest = parts[2], parts[3:]
        else:
            raise err_not_found_path()
        watch = False
        if rest and rest[0] == "watch":
            watch, rest = True, rest[1:]
        if not rest:
            return ("discovery", "resources", group, version)
        ns = None
        if rest[0] == "namespaces" and len(rest) >= 3 and not (group == "" and rest[2] in ("status", "finalize")):
            ns, rest = rest[1], rest[2:]
        if len(rest) > 3:
            raise err_not_found_path()
        with self.state.lock:
            rt = self.state.find_type(group, version, rest[0])
        if rt is None and not builtin_group(group):
            raise PageNotFound()
        if rt is None or (ns is not None and not rt.namespaced):
            raise err_not_found_path()
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if sub is not None and not (sub == "status" and rt.status_sub):
            raise err_not_found_path()
        if rt.namespaced and ns is None and name is not None:
            raise err_not_found_path()
        return ("resource", rt, version, ns, name, sub, watch)

    def handle(self, req):
        if req.path in ("/version", "/version/"):
            return self.json(200, SERVER_VERSION)
        if req.path in ("/healthz", "/livez", "/readyz"):
            return 200, {"Content-Type": "text/plain; charset=utf-8"}, b"ok"
        if req.path.startswith("/openapi/"):
            return self.openapi(req)
        r = self.route(req)
        if r[0] == "discovery":
            if req.method != "GET":
                raise ApiError(405, "MethodNotAllowed", MSG_METHOD, {})
            return self.discovery(*r[1:])
        _, rt, version, ns, name, sub, watch = r
        m = req.method
        if watch or req.q("watch") in ("true", "1"):
            if m != "GET":
                raise ApiError(405, "MethodNotAllowed", MSG_METHOD, {})
            return self.watch(req, rt, version, ns, name)
        verb = {("GET", False): "list", ("GET", True): "get", ("POST", False): "create",
                ("PUT", True): "update", ("PATCH", True): "patch", ("DELETE", True): "delete",
                ("DELETE", False): "deletecollection"}.get((m, name is not None))
        if verb is None or verb not in rt.verbs:
            raise ApiError(405, "MethodNotAllowed", MSG_METHOD, {})
        if verb == "create" and rt.namespaced and ns is None:
            raise ApiError(405, "MethodNotAllowed", MSG_METHOD, {})
        with self.state.lock:
            if self.state.denied(verb, rt.group, rt.plural + ("/" + sub if sub else ""), ns, name):
                raise err_forbidden(rt, verb, ns, name, sub)
        dry = self.dry_run(req)
        if verb == "get":
            return self.get(req, rt, version, ns, name)
        if verb == "list":
            return self.list(req, rt, version, ns)
        if verb == "create":
            if rt.plural in ("selfsubjectaccessreviews", "subjectaccessreviews"):
                return self.ssar(req, rt, version)
            if rt.plural == "selfsubjectreviews":
                return self.ssr(req, rt, version)
            return self.create(req, rt, version, ns, dry)
        if verb == "update":
            return self.update(req, rt, version, ns, name, sub, dry)
        if verb == "patch":
            return self.patch(req, rt, version, ns, name, sub, dry)
        if verb == "delete":
            return self.delete(req, rt, version, ns, name, dry)
        return self.delete_collection(req, rt, version, ns, dry)

    # -- helpers the mixins share -------------------------------------------------
    @staticmethod
    def json(code, obj, headers=None):
        h = {"Content-Type": "application/json"}
        if headers:
            h.update(headers)
        return code, h, dumps(obj)

    @staticmethod
    def dry_run(req):
        values = req.query.get("dryRun") or []
        for v in values:
            if v != "All":
                raise ApiError(400, "BadRequest", 'Invalid dryRun parameter: "%s": supported values: "All"' % v)
        return bool(values)

    versioned = staticmethod(versioned)
