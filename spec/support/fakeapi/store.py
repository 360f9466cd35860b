"""The store: objects by type and key, resource versions, CRD-defined types,
list snapshots for continue tokens, the watch history, the fault rules and the
request log, all under one lock; and the fixtures it is loaded from."""

import collections
import json
import threading
import uuid

from fakeapi import authz
from fakeapi.authz import prepare_allow_rules
from fakeapi.resources import builtin_types, crd_type, versioned
from fakeapi.util import deep, dumps, item_key, now_rfc3339
from fakeapi.validation import name_label


class State:
    def __init__(self, deny_rules):
        self.lock = threading.RLock()
        self.flag_denies = list(deny_rules)
        self.reset([])

    # -- loading ------------------------------------------------------------
    def reset(self, items):
        with self.lock:
            self.rv = 0
            self.compacted = 0
            # list snapshots for continue tokens, keyed by (type, namespace, selectors, rv):
            # stored objects are never mutated in place, so a snapshot is a list of references
            self.snapshots = collections.OrderedDict()
            # a custom resource's JSON as a list item, by (group, plural, kind, version, key):
            # (the stored object it encodes, the bytes); valid while that object is
            # the stored one, which is never mutated in place. Lists of thousands of
            # objects are then joined, not encoded again on every page.
            self.encoded = {}
            self.types = {}
            for rt in builtin_types():
                self.types[(rt.group, rt.plural)] = rt
            self.objects = {}          # (group, plural) -> {(ns, name): obj}
            self.fixture_denies = []
            self.runtime_denies = []
            # allow-list mode: None = off (everything not denied is allowed);
            # a list (even empty) = only requests an allow rule matches
            self.fixture_allows = []
            self.runtime_allows = None
            self.faults = []
            self.log = []
            self.seq = getattr(self, "seq", 0)
            self.history = []        # (seq, rv, (group, plural), event, object) for watches
            self.cond = threading.Condition(self.lock)
            crds = [o for o in items if isinstance(o, dict) and o.get("kind") == "CustomResourceDefinition"]
            rest = [o for o in items if o not in crds]
            for o in crds + rest:
                self._load(o)
            max_rv = 0
            for bucket in self.objects.values():
                for o in bucket.values():
                    try:
                        max_rv = max(max_rv, int(o["metadata"]["resourceVersion"]))
                    except (KeyError, ValueError):
                        pass
            self.rv = max(self.rv, max_rv)
            for bucket in self.objects.values():
                for o in bucket.values():
                    if not o["metadata"].get("resourceVersion"):
                        self.rv += 1
                        o["metadata"]["resourceVersion"] = str(self.rv)
            # the fixture's custom resources encoded now, in the version they are
            # stored in, not on the first list (a benchmark lists each object once
            # after a reset)
            for (group, plural), bucket in self.objects.items():
                rt = self.types.get((group, plural))
                if rt is None or not rt.custom:
                    continue
                for (ns, name), o in bucket.items():
                    version = str(o.get("apiVersion", "")).rpartition("/")[2]
                    if version in rt.versions:
                        self.encoded_item(rt, version, item_key(ns, name), o)

    def encoded_item(self, rt, version, key, o):
        """The JSON of stored object o as an item of a list of rt in `version`,
        encoded once while o is the stored object (see self.encoded)."""
        k = (rt.group, rt.plural, rt.kind, version, key)
        hit = self.encoded.get(k)
        if hit is None or hit[0] is not o:
            hit = self.encoded[k] = (o, dumps(versioned(rt, version, o)))
        return hit[1]

    def forget_encoded(self, rt, key):
        """A deleted object's list bytes go with it, in every version."""
        for version in rt.versions:
            self.encoded.pop((rt.group, rt.plural, rt.kind, version, key), None)

    def _load(self, o):
        if not isinstance(o, dict):
            raise ValueError("fixture item is not an object: %r" % (o,))
        if o.get("kind") == "FakeDeny":
            self.fixture_denies.append(o)
            return
        if o.get("kind") == "FakeAllow":
            rule = {k: v for k, v in o.items() if k not in ("kind", "apiVersion")}
            self.fixture_allows.extend(prepare_allow_rules([rule]))
            return
        api_version, kind = o.get("apiVersion", ""), o.get("kind", "")
        group, _, version = api_version.rpartition("/")
        rt = next((t for t in self.types.values() if t.group == group and t.kind == kind), None)
        if rt is None or version not in rt.versions:
            raise ValueError("fixture object of unknown type %s %s (list its CRD first)" % (api_version, kind))
        o = deep(o)
        meta = o.setdefault("metadata", {})
        if not meta.get("name"):
            raise ValueError("fixture %s has no metadata.name" % kind)
        if rt.namespaced:
            meta.setdefault("namespace", "default")
        else:
            meta.pop("namespace", None)
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", now_rfc3339())
        if rt.has_generation:
            meta.setdefault("generation", 1)
        self._decorate_new(rt, o)
        self.objects.setdefault((rt.group, rt.plural), {})[(meta.get("namespace", ""), meta["name"])] = o
        if kind == "CustomResourceDefinition":
            self._register_crd(o)

    # -- types ----------------------------------------------------------------
    def _register_crd(self, crd):
        rt = crd_type(crd)
        if rt is None:
            return
        existing = self.types.get((rt.group, rt.plural))
        if existing is None or existing.custom:
            self.types[(rt.group, rt.plural)] = rt

    def _unregister_crd(self, crd):
        rt = crd_type(crd)
        if rt is not None and (rt.group, rt.plural) in self.types and self.types[(rt.group, rt.plural)].custom:
            del self.types[(rt.group, rt.plural)]
            self.objects.pop((rt.group, rt.plural), None)

    def find_type(self, group, version, plural):
        rt = self.types.get((group, plural))
        if rt is None or version not in rt.versions:
            return None
        return rt

    def groups(self):
        out = {}
        for rt in self.types.values():
            out.setdefault(rt.group, set()).update(rt.versions)
        return out

    # -- bookkeeping ------------------------------------------------------
    def next_rv(self):
        self.rv += 1
        return str(self.rv)

    def _decorate_new(self, rt, o):
        if rt.plural == "namespaces" and not rt.group:
            o.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
            o.setdefault("status", {}).setdefault("phase", "Active")
            name_label(rt, o)
        if rt.plural == "customresourcedefinitions":
            names = (o.get("spec") or {}).get("names") or {}
            o["status"] = {
                "acceptedNames": names,
                "conditions": [
                    {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
                     "message": "no conflicts found", "lastTransitionTime": now_rfc3339()},
                    {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                     "message": "the initial names have been accepted", "lastTransitionTime": now_rfc3339()},
                ],
                "storedVersions": [v["name"] for v in (o.get("spec") or {}).get("versions") or []
                                   if v.get("storage")],
            }

    def bucket(self, rt):
        return self.objects.setdefault((rt.group, rt.plural), {})

    def namespace_exists(self, ns):
        return ("", ns) in self.objects.get(("", "namespaces"), {})

    # -- authorization (fakeapi.authz) ------------------------------------------
    def denied(self, verb, group, resource, ns, name=None):
        return authz.denied(self, verb, group, resource, ns, name)

    # -- watch notification -----------------------------------------------------
    def notify(self, rt, event, obj):
        # Stored objects are never mutated in place, so the history can share them.
        self.seq += 1
        self.history.append((self.seq, int(obj["metadata"].get("resourceVersion") or self.rv),
                             (rt.group, rt.plural), event, obj))
        if len(self.history) > 5000:
            del self.history[:1000]
        self.cond.notify_all()


def load_fixture_text(text):
    """The objects of a fixture: a v1 List, an array of Lists or objects, or one object."""
    data = json.loads(text)
    if isinstance(data, dict) and data.get("kind") == "List" or isinstance(data, dict) and "items" in data:
        return data.get("items") or []
    if isinstance(data, list):
        # an array of Lists (several fixture files in one reset) or of objects
        out = []
        for d in data:
            if isinstance(d, dict) and d.get("kind") == "List":
                out.extend(d.get("items") or [])
            else:
                out.append(d)
        return out
    if isinstance(data, dict):
        return [data]
    raise ValueError("a fixture must be a v1 List")
