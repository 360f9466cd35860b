"""The reviews: SelfSubjectReview (who the caller is), SelfSubjectAccessReview
and SubjectAccessReview (may it do this?, answered by fakeapi.authz), including
the protobuf kubectl auth can-i sends."""

from fakeapi.errors import err_bad_request, err_invalid

# The one user the fake authenticates (SelfSubjectReview's answer).
FAKE_USER = "fake-apiserver:admin"


def _varint(buf, i):
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7


def pb_fields(buf):
    """Field number -> list of raw values, for the little protobuf this server reads."""
    out, i = {}, 0
    while i < len(buf):
        key, i = _varint(buf, i)
        wt = key & 7
        if wt == 0:
            v, i = _varint(buf, i)
        elif wt == 2:
            n, i = _varint(buf, i)
            v, i = bytes(buf[i:i + n]), i + n
        elif wt == 1:
            v, i = buf[i:i + 8], i + 8
        elif wt == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError("unsupported protobuf wire type %d" % wt)
        out.setdefault(key >> 3, []).append(v)
    return out


def ssar_from_protobuf(body):
    """kubectl auth can-i sends its SelfSubjectAccessReview as protobuf (the k8s envelope:
    'k8s\\0' + runtime.Unknown{typeMeta, raw}); decode just the attributes."""
    if not body.startswith(b"k8s\x00"):
        raise ValueError("not a kubernetes protobuf envelope")
    raw = pb_fields(body[4:])[2][0]
    spec = pb_fields(pb_fields(raw).get(2, [b""])[0])
    out = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview", "metadata": {}, "spec": {}}
    if 1 in spec:
        f = pb_fields(spec[1][0])
        names = ["namespace", "verb", "group", "version", "resource", "subresource", "name"]
        out["spec"]["resourceAttributes"] = {n: f[i + 1][0].decode() for i, n in enumerate(names) if i + 1 in f}
    if 2 in spec:
        f = pb_fields(spec[2][0])
        out["spec"]["nonResourceAttributes"] = {n: f[i + 1][0].decode() for i, n in enumerate(["path", "verb"])
                                                if i + 1 in f}
    return out


class ReviewsMixin:
    """Api's creates of the review types (fakeapi.routing.Api)."""

    def ssr(self, req, rt, version):
        """Who the caller is. The fake has one identity (its token, or none):
        FAKE_USER, authenticated, as kube-apiserver answers for a token user;
        impersonating (allowed, as for kube-apiserver's admin), the user its
        Impersonate-* headers name, with system:authenticated added to the
        groups as kube-apiserver adds it."""
        obj = self.parse_body(req)
        self.check_type_meta(rt, version, obj)
        obj["metadata"] = {"creationTimestamp": None}
        info = {"username": FAKE_USER, "groups": ["system:authenticated"]}
        imp = req.impersonate
        if imp is not None:
            if not imp["user"]:
                raise err_bad_request("requested %s without impersonating a user" % sorted(k for k in imp if imp[k]))
            groups = list(imp["groups"])
            if not any(g in ("system:authenticated", "system:unauthenticated") for g in groups):
                groups.append("system:authenticated")
            info = {"username": imp["user"], "groups": groups}
            if imp.get("uid"):
                info["uid"] = imp["uid"]
            if imp["extra"]:
                info["extra"] = imp["extra"]
        obj["status"] = {"userInfo": info}
        return self.json(201, obj)

    def ssar(self, req, rt, version):
        if req.content_type == "application/vnd.kubernetes.protobuf":
            try:
                obj = ssar_from_protobuf(req.body)
            except (ValueError, KeyError, IndexError, UnicodeDecodeError) as e:
                raise err_bad_request("cannot decode protobuf SelfSubjectAccessReview: %s" % e)
        else:
            obj = self.parse_body(req)
        self.check_type_meta(rt, version, obj)
        spec = obj.get("spec") or {}
        ra = spec.get("resourceAttributes")
        if rt.plural == "subjectaccessreviews" and not spec.get("user") and not spec.get("groups"):
            raise err_invalid(rt, "", [("spec.user", "Invalid", "at least one of user or group must be specified")])
        if not ra and not spec.get("nonResourceAttributes"):
            raise err_invalid(rt, "", [("spec.resourceAttributes", "FieldValueRequired",
                                        "Required value: exactly one of nonResourceAttributes or "
                                        "resourceAttributes must be specified")])
        allowed = True
        if ra:
            resource = ra.get("resource", "") + ("/" + ra["subresource"] if ra.get("subresource") else "")
            with self.state.lock:
                allowed = not self.state.denied(ra.get("verb", ""), ra.get("group", ""), resource,
                                                ra.get("namespace", ""), ra.get("name") or None)
        obj["metadata"].setdefault("creationTimestamp", None)
        # RBAC's answer: no reason on a denial, as when no rule allows it
        obj["status"] = {"allowed": allowed}
        return self.json(201, obj)
