"""Writes: create, update, patch, delete and deletecollection, with what
kube-apiserver does around them (type meta and metadata checks, preconditions,
resourceVersion and generation bookkeeping, finalizers, the status
subresource, instantaneous namespace deletion, dry runs)."""

import json
import uuid

import jsonpatch

from fakeapi.errors import (ApiError, MSG_INVALID_PATCH, err_already_exists, err_bad_request, err_conflict,
    err_invalid, err_not_found, res_details)
from fakeapi.patching import (PATCH_APPLY, PATCH_JSON, PATCH_MERGE, PATCH_STRATEGIC, copy_for_patch,
    go_json_kind, merge_patch, strategic_merge)
from fakeapi.util import deep, dumps, item_key, now_rfc3339
from fakeapi.validation import drop_empty_maps, meta_map_causes, name_label


class WritesMixin:
    """Api's write verbs (fakeapi.routing.Api)."""

    def parse_body(self, req):
        if not req.body:
            raise err_bad_request("the body of the request was empty")
        if req.content_type and req.content_type not in ("application/json", PATCH_JSON, PATCH_MERGE, PATCH_STRATEGIC):
            raise ApiError(415, "UnsupportedMediaType",
                           'the body of the request was in an unknown format - accepted media types include: '
                           'application/json, application/yaml, application/vnd.kubernetes.protobuf', {})
        try:
            return json.loads(req.body)
        except (ValueError, UnicodeDecodeError) as e:
            raise err_bad_request("the body of the request could not be decoded as JSON: %s" % e)


    def check_type_meta(self, rt, version, obj):
        if not isinstance(obj, dict):
            raise err_bad_request("the body of the request was not a JSON object")
        kind, av = obj.get("kind"), obj.get("apiVersion")
        if kind and kind != rt.kind:
            raise err_bad_request('the kind of the object (%s) does not match the kind of the resource (%s)'
                                  % (kind, rt.kind))
        if av and av != rt.api_version(version) and av.rpartition("/")[0] != rt.group:
            raise err_bad_request('the API version in the data (%s) does not match the expected API version (%s)'
                                  % (av, rt.api_version(version)))
        obj["apiVersion"] = rt.api_version(version)
        obj["kind"] = rt.kind
        if not isinstance(obj.get("metadata", {}), dict):
            raise err_bad_request("metadata must be an object")
        obj.setdefault("metadata", {})
        meta = obj["metadata"]
        for f in ("labels", "annotations"):
            v = meta.get(f)
            if v is not None and (not isinstance(v, dict) or not all(isinstance(x, str) for x in v.values())):
                raise err_bad_request("metadata.%s must be a map of strings" % f)
        if rt.plural == "configmaps" and not rt.group:
            data = obj.get("data")
            if data is not None and (not isinstance(data, dict) or not all(isinstance(x, str) for x in data.values())):
                raise err_bad_request("ConfigMap data must be a map of strings")


    # -- writes --------------------------------------------------------------------
    def create(self, req, rt, version, ns, dry):
        obj = self.parse_body(req)
        self.check_type_meta(rt, version, obj)
        return self.insert(rt, version, ns, obj, dry)

    def insert(self, rt, version, ns, obj, dry):
        """A new object (its type meta checked): a create's, or an apply's of an absent one."""
        st = self.state
        meta = obj["metadata"]
        if rt.namespaced:
            if meta.get("namespace") and meta["namespace"] != ns:
                raise err_bad_request("the namespace of the provided object does not match the namespace sent on the request")
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        with st.lock:
            if not meta.get("name"):
                if meta.get("generateName"):
                    meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
                else:
                    raise err_invalid(rt, "", [("metadata.name", "FieldValueRequired",
                                                "Required value: name or generateName is required")])
            name = meta["name"]
            causes = meta_map_causes(meta)
            if causes:
                raise err_invalid(rt, name, causes)
            if rt.plural == "customresourcedefinitions":
                self.validate_crd(rt, obj)
            if rt.namespaced and not st.namespace_exists(ns):
                raise err_not_found(st.types[("", "namespaces")], ns)
            bucket = st.bucket(rt)
            if (ns or "", name) in bucket:
                raise err_already_exists(rt, name)
            for f in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"):
                meta.pop(f, None)
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now_rfc3339()
            if rt.has_generation:
                meta["generation"] = 1
            else:
                meta.pop("generation", None)
            if rt.status_sub and rt.custom:
                obj.pop("status", None)
            drop_empty_maps(rt, obj)
            st._decorate_new(rt, obj)
            if not dry:
                meta["resourceVersion"] = st.next_rv()
                bucket[(ns or "", name)] = obj
                if rt.plural == "customresourcedefinitions":
                    st._register_crd(obj)
                st.notify(rt, "ADDED", obj)
            return 201, {"Content-Type": "application/json"}, dumps(obj)

    def validate_crd(self, rt, obj):
        spec = obj.get("spec") or {}
        names = spec.get("names") or {}
        causes = []
        if not spec.get("group"):
            causes.append(("spec.group", "FieldValueRequired", "Required value"))
        if not names.get("plural"):
            causes.append(("spec.names.plural", "FieldValueRequired", "Required value"))
        if not names.get("kind"):
            causes.append(("spec.names.kind", "FieldValueRequired", "Required value"))
        if spec.get("scope") not in ("Namespaced", "Cluster"):
            causes.append(("spec.scope", "NotSupported", 'Unsupported value: "%s": supported values: "Cluster", '
                           '"Namespaced"' % spec.get("scope", "")))
        if not spec.get("versions"):
            causes.append(("spec.versions", "FieldValueRequired", "Required value: must have exactly one version marked as storage version"))
        name = obj["metadata"].get("name", "")
        if not causes and name != "%s.%s" % (names["plural"], spec["group"]):
            causes.append(("metadata.name", "FieldValueInvalid",
                           'Invalid value: "%s": must be spec.names.plural+"."+spec.group' % name))
        if causes:
            raise err_invalid(rt, name, causes)

    def commit(self, rt, version, ns, name, old, new, sub, dry, require_rv):
        """The common tail of update and patch: preconditions, bookkeeping, persistence."""
        st = self.state
        self.check_type_meta(rt, version, new)
        meta = new["metadata"]
        if meta.get("name", name) != name:
            raise err_bad_request('the name of the object (%s) does not match the name on the URL (%s)'
                                  % (meta.get("name"), name))
        if rt.namespaced and meta.get("namespace", ns) != ns:
            raise err_bad_request("the namespace of the provided object does not match the namespace sent on the request")
        causes = meta_map_causes(meta)
        if causes:
            raise err_invalid(rt, name, causes)
        rv = meta.get("resourceVersion")
        old_meta = old["metadata"]
        if rv:
            if rv != old_meta.get("resourceVersion"):
                raise err_conflict(rt, name)
        elif require_rv:
            raise err_invalid(rt, name, [("metadata.resourceVersion", "FieldValueInvalid",
                                          "Invalid value: 0x0: must be specified for an update")])
        if sub == "status":
            status = new.get("status")
            new = deep(old)
            if status is None:
                new.pop("status", None)
            else:
                new["status"] = status
            meta = new["metadata"]
        elif rt.status_sub:
            if "status" in old:
                new["status"] = deep(old["status"])
            else:
                new.pop("status", None)
        meta["name"] = name
        if rt.namespaced:
            meta["namespace"] = ns
        name_label(rt, new)
        drop_empty_maps(rt, new)
        if "managedFields" not in meta and "managedFields" in old_meta:
            meta["managedFields"] = old_meta["managedFields"]  # an update without them keeps them
        for f in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation"):
            if f in old_meta:
                meta[f] = old_meta[f]
            else:
                meta.pop(f, None)
        meta["resourceVersion"] = old_meta.get("resourceVersion")
        if rt.has_generation:
            def content(o):
                return {k: v for k, v in o.items() if k not in ("metadata", "status" if rt.status_sub else "")}
            if content(new) != content(old):
                meta["generation"] = int(old_meta.get("generation", 1)) + 1
        if new == old:
            return 200, {"Content-Type": "application/json"}, dumps(self.versioned(rt, version, old))
        gone = bool(meta.get("deletionTimestamp")) and not meta.get("finalizers")
        if not dry:
            meta["resourceVersion"] = st.next_rv()
            bucket = st.bucket(rt)
            if gone:
                self.remove(rt, ns, name, new)
            else:
                bucket[(ns or "", name)] = new
                if rt.plural == "customresourcedefinitions":
                    st._register_crd(new)
                st.notify(rt, "MODIFIED", new)
        return 200, {"Content-Type": "application/json"}, dumps(self.versioned(rt, version, new))

    def remove(self, rt, ns, name, obj):
        st = self.state
        st.bucket(rt).pop((ns or "", name), None)
        st.forget_encoded(rt, item_key(ns, name))
        st.notify(rt, "DELETED", obj)
        if rt.plural == "customresourcedefinitions":
            st._unregister_crd(obj)
        if rt.plural == "namespaces" and not rt.group:
            for (g, p), bucket in st.objects.items():
                for key in [k for k in bucket if k[0] == name and st.types.get((g, p)) and st.types[(g, p)].namespaced]:
                    bucket.pop(key)

    def current(self, rt, ns, name):
        o = self.state.objects.get((rt.group, rt.plural), {}).get((ns or "", name))
        if o is None:
            raise err_not_found(rt, name)
        return o

    def update(self, req, rt, version, ns, name, sub, dry):
        new = self.parse_body(req)
        if not isinstance(new, dict):
            raise err_bad_request("the body of the request was not a JSON object")
        with self.state.lock:
            old = self.current(rt, ns, name)
            return self.commit(rt, version, ns, name, old, new, sub, dry, require_rv=rt.custom)

    def patch(self, req, rt, version, ns, name, sub, dry):
        ct = req.content_type
        if ct == PATCH_APPLY:
            return self.apply_patch(req, rt, version, ns, name, sub, dry)
        allowed = [PATCH_JSON, PATCH_MERGE] + ([] if rt.custom else [PATCH_STRATEGIC])
        if ct not in allowed:
            raise ApiError(415, "UnsupportedMediaType",
                           "the body of the request was in an unknown format - accepted media types include: "
                           + ", ".join(allowed + [PATCH_APPLY]), {})
        try:
            patch = json.loads(req.body or b"")
        except (ValueError, UnicodeDecodeError) as e:
            raise err_bad_request("error decoding patch: %s" % e)
        with self.state.lock:
            old = self.current(rt, ns, name)
            if ct == PATCH_JSON:
                # Undecodable (not a list of objects): 400. Anything that fails while applying,
                # an unknown op or a missing member included: the generic 422, as evanphx/json-patch
                # reports it through kube-apiserver.
                if not isinstance(patch, list) or not all(isinstance(op, dict) for op in patch):
                    # encoding/json's words, as kube-apiserver's patch handler passes them on
                    bad, target = patch, "[]handlers.jsonPatchOp"
                    if isinstance(patch, list):
                        bad = next(op for op in patch if not isinstance(op, dict))
                        target = "handlers.jsonPatchOp"
                    raise err_bad_request("error decoding patch: json: cannot unmarshal %s into Go value of type %s"
                                          % (go_json_kind(bad), target))
                # only what the patch writes is copied, the rest shared with the
                # stored object: a deep copy was a third of a PATCH's CPU
                shared = copy_for_patch(old, patch)
                doc = self.versioned(rt, version, shared if shared is not None else deep(old))
                try:
                    # doc is already this request's own copy: applying in place spares
                    # jsonpatch a second (pure Python) deep copy, half of a PATCH's CPU
                    new = jsonpatch.JsonPatch(patch).apply(doc, in_place=True)
                except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, KeyError, IndexError,
                        TypeError, ValueError):
                    raise ApiError(422, "Invalid", MSG_INVALID_PATCH, {})
            else:
                if not isinstance(patch, dict):
                    raise err_bad_request("json: cannot unmarshal array into Go value of type map[string]interface {}")
                doc = self.versioned(rt, version, deep(old))
                new = merge_patch(doc, patch) if ct == PATCH_MERGE else strategic_merge(doc, patch)
            if not isinstance(new, dict):
                raise err_bad_request("the patched object is not a JSON object")
            return self.commit(rt, version, ns, name, old, new, sub, dry, require_rv=False)

    def delete_options(self, req):
        if not req.body or not req.body.strip():
            return {}
        try:
            opts = json.loads(req.body)
        except (ValueError, UnicodeDecodeError) as e:
            raise err_bad_request("the body of the request could not be decoded as DeleteOptions: %s" % e)
        if not isinstance(opts, dict):
            raise err_bad_request("DeleteOptions must be a JSON object")
        return opts

    @staticmethod
    def delete_dry_run(req, opts, query_dry):
        """A delete's dryRun, as kube-apiserver reads it: from the DeleteOptions
        body when the request has one (the query's dryRun is then ignored),
        else from the query."""
        if req.body and req.body.strip():
            return "All" in (opts.get("dryRun") or [])
        return query_dry

    def delete(self, req, rt, version, ns, name, dry):
        opts = self.delete_options(req)
        dry = self.delete_dry_run(req, opts, dry)
        st = self.state
        with st.lock:
            old = self.current(rt, ns, name)
            return self.delete_one(rt, version, ns, name, old, opts, dry)

    def delete_one(self, rt, version, ns, name, old, opts, dry):
        st = self.state
        pre = opts.get("preconditions") or {}
        meta = old["metadata"]
        if pre.get("uid") and pre["uid"] != meta.get("uid"):
            raise err_conflict(rt, name, "Precondition failed: UID in precondition: %s, UID in object meta: %s"
                               % (pre["uid"], meta.get("uid")))
        if pre.get("resourceVersion") and pre["resourceVersion"] != meta.get("resourceVersion"):
            raise err_conflict(rt, name, "the ResourceVersion in the precondition (%s) does not match the "
                               "ResourceVersion in record (%s). The object might have been modified"
                               % (pre["resourceVersion"], meta.get("resourceVersion")))
        if meta.get("finalizers"):
            if meta.get("deletionTimestamp"):
                return self.json(200, self.versioned(rt, version, old))
            new = deep(old)
            new["metadata"]["deletionTimestamp"] = now_rfc3339()
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            if not dry:
                new["metadata"]["resourceVersion"] = st.next_rv()
                st.bucket(rt)[(ns or "", name)] = new
                st.notify(rt, "MODIFIED", new)
            return self.json(200, self.versioned(rt, version, new))
        if rt.plural == "namespaces" and not rt.group:
            # The namespace controller is emulated as instantaneous: contents go at once.
            new = deep(old)
            new["metadata"]["deletionTimestamp"] = now_rfc3339()
            new.setdefault("status", {})["phase"] = "Terminating"
            if not dry:
                new["metadata"]["resourceVersion"] = st.next_rv()
                self.remove(rt, ns, name, new)
            return self.json(200, self.versioned(rt, version, new))
        if not dry:
            gone = dict(old)
            gone["metadata"] = dict(meta)
            gone["metadata"]["resourceVersion"] = st.next_rv()
            self.remove(rt, ns, name, gone)
        details = res_details(rt, name)
        details["uid"] = meta.get("uid")
        return self.json(200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                               "details": details})

    def delete_collection(self, req, rt, version, ns, dry):
        opts = self.delete_options(req)
        dry = self.delete_dry_run(req, opts, dry)
        with self.state.lock:
            matched, _ = self.select(req, rt, ns)
            items = []
            for _, o in matched:
                m = o["metadata"]
                self.delete_one(rt, version, m.get("namespace"), m["name"], o, {}, dry)
                items.append(self.versioned(rt, version, o))
            return self.json(200, {"kind": rt.list_kind, "apiVersion": rt.api_version(version),
                                   "metadata": {"resourceVersion": str(self.state.rv)}, "items": items})
