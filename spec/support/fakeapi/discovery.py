"""Discovery: /api, /apis, each group and group version's resource list, and a
minimal OpenAPI v3 (what kubectl needs to resolve names and send patches)."""

from fakeapi.errors import ApiError, MSG_METHOD, PageNotFound, err_not_found_path
from fakeapi.resources import SUBRESOURCE_VERBS, builtin_group, version_priority


class DiscoveryMixin:
    """Api's discovery answers (fakeapi.routing.Api)."""

    # -- discovery ---------------------------------------------------------------
    def discovery(self, what, *args):
        st = self.state
        with st.lock:
            if what == "api":
                host = self.base_url().split("://", 1)[1]
                return self.json(200, {"kind": "APIVersions", "versions": ["v1"],
                                       "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0",
                                                                       "serverAddress": host}]})
            groups = st.groups()
            if what == "apis":
                return self.json(200, {"kind": "APIGroupList", "apiVersion": "v1",
                                       "groups": [self.group_obj(g, vs) for g, vs in sorted(groups.items()) if g]})
            if what == "group":
                g = args[0]
                if g and g not in groups and not builtin_group(g):
                    raise PageNotFound()
                if not g or g not in groups:
                    raise err_not_found_path()
                body = self.group_obj(g, groups[g])
                body.update({"kind": "APIGroup", "apiVersion": "v1"})
                return self.json(200, body)
            group, version = args
            if (group not in groups or version not in groups[group]) and not builtin_group(group):
                raise PageNotFound()
            if group not in groups or version not in groups[group]:
                raise err_not_found_path()
            resources = []
            for rt in sorted(st.types.values(), key=lambda t: t.plural):
                if rt.group != group or version not in rt.versions:
                    continue
                r = {"name": rt.plural, "singularName": rt.singular, "namespaced": rt.namespaced,
                     "kind": rt.kind, "verbs": rt.verbs}
                if rt.short_names:
                    r["shortNames"] = rt.short_names
                if rt.categories:
                    r["categories"] = rt.categories
                resources.append(r)
                if rt.status_sub:
                    resources.append({"name": rt.plural + "/status", "singularName": "", "namespaced": rt.namespaced,
                                      "kind": rt.kind, "verbs": SUBRESOURCE_VERBS})
            return self.json(200, {"kind": "APIResourceList", "apiVersion": "v1",
                                   "groupVersion": (group + "/" + version) if group else version,
                                   "resources": resources})

    @staticmethod
    def group_obj(g, versions):
        ordered = sorted(versions, key=version_priority)
        vs = [{"groupVersion": "%s/%s" % (g, v), "version": v} for v in ordered]
        return {"name": g, "versions": vs, "preferredVersion": vs[0]}

    def openapi(self, req):
        """A minimal OpenAPI v3: the index and, per group version, PATCH operations that
        advertise fieldValidation, which is what kubectl create/apply check before sending."""
        if req.method != "GET":
            raise ApiError(405, "MethodNotAllowed", MSG_METHOD, {})
        path = req.path.rstrip("/")
        st = self.state
        with st.lock:
            gvs = {}
            for rt in st.types.values():
                for v in rt.versions:
                    key = ("api/" + v) if not rt.group else "apis/%s/%s" % (rt.group, v)
                    gvs.setdefault(key, []).append((rt, v))
            if path == "/openapi/v3":
                return self.json(200, {"paths": {k: {"serverRelativeURL": "/openapi/v3/%s?hash=%d" % (k, st.rv)}
                                                 for k in sorted(gvs)}})
            if path.startswith("/openapi/v3/") and path[len("/openapi/v3/"):] in gvs:
                paths = {}
                for rt, v in gvs[path[len("/openapi/v3/"):]]:
                    if "patch" not in rt.verbs:
                        continue
                    prefix = "/api/" + v if not rt.group else "/apis/%s/%s" % (rt.group, v)
                    p = prefix + ("/namespaces/{namespace}/" if rt.namespaced else "/") + rt.plural + "/{name}"
                    paths[p] = {"patch": {
                        "x-kubernetes-action": "patch",
                        "x-kubernetes-group-version-kind": {"group": rt.group, "version": v, "kind": rt.kind},
                        "parameters": [{"name": n, "in": "query", "schema": {"type": "string"}}
                                       for n in ("dryRun", "fieldManager", "fieldValidation", "force")],
                        "responses": {"200": {"description": "OK"}}}}
                return self.json(200, {"openapi": "3.0.0",
                                       "info": {"title": "Kubernetes (fake)", "version": "v1.32.0"},
                                       "paths": paths, "components": {"schemas": {}}})
        raise err_not_found_path()
