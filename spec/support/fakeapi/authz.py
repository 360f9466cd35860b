"""Authorization: deny rules, allow rules (RBAC-like allow-list mode) and the
decision they make on a request's verb, group, resource, namespace and name."""

# RBAC's bootstrap role system:basic-user lets any user create these reviews.
SELF_REVIEWS = {("authorization.k8s.io", "selfsubjectaccessreviews"),
                ("authorization.k8s.io", "selfsubjectrulesreviews"),
                ("authentication.k8s.io", "selfsubjectreviews")}


def denied(state, verb, group, resource, ns, name=None):
    """Is this request refused? Deny rules (--deny, FakeDeny fixture objects,
    POST /_fake/denies) refuse what they match; with allow rules installed
    (FakeAllow, POST /_fake/allows), only what one of them matches is allowed."""
    for rule in state.flag_denies + state.fixture_denies + state.runtime_denies:
        if rule.get("verb", "*") not in ("*", verb):
            continue
        if rule.get("group", "*") not in ("*", group):
            continue
        if rule.get("resource", "*") not in ("*", resource):
            continue
        if rule.get("namespace") not in (None, "*", ns or ""):
            continue
        return True
    allows = state.fixture_allows + (state.runtime_allows or [])
    if state.runtime_allows is None and not state.fixture_allows:
        return False
    # RBAC's bootstrap role system:basic-user, bound to every authenticated
    # user, lets anyone ask what they themselves may do
    if verb == "create" and (group, resource) in SELF_REVIEWS:
        return False
    # allow-list mode, as RBAC: a rule with a namespace covers that namespace
    # only (a Role), one without covers every namespace and the cluster scope
    # (a ClusterRole); a rule with a name covers requests naming that object
    # (resourceNames: never a list or a create)
    for rule in allows:
        if rule["verb"] not in ("*", verb):
            continue
        if rule["group"] not in ("*", group):
            continue
        if rule["resource"] not in ("*", resource):
            continue
        if "namespace" in rule and rule["namespace"] != (ns or ""):
            continue
        if "name" in rule and rule["name"] != name:
            continue
        return False
    return True


ALLOW_KEYS = ("verb", "group", "resource", "namespace", "name")


def prepare_allow_rules(rules):
    """Allow rules, checked: a typo must not widen (or silently narrow) what is allowed."""
    if not isinstance(rules, list):
        raise ValueError("want a JSON array of {verb, group, resource[, namespace][, name]} or null")
    out = []
    for i, r in enumerate(rules):
        if not isinstance(r, dict):
            raise ValueError("rule %d is not an object" % i)
        unknown = sorted(set(r) - set(ALLOW_KEYS))
        if unknown:
            raise ValueError("rule %d: unknown key %s" % (i, ", ".join(unknown)))
        for k in ("verb", "group", "resource"):
            if not isinstance(r.get(k), str):
                raise ValueError("rule %d: %s must be a string (\"\" is the core group, \"*\" any)" % (i, k))
        for k in ("namespace", "name"):
            if k in r and not isinstance(r[k], str):
                raise ValueError("rule %d: %s must be a string" % (i, k))
        if r["verb"] == "" or r["resource"] == "":
            raise ValueError("rule %d: empty verb or resource" % i)
        out.append(dict(r))
    return out
