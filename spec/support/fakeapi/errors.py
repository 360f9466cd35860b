"""Errors: every failure is a metav1.Status, shaped as kube-apiserver writes it
(ApiError and the constructors of the Status each failure gives)."""

MSG_NOT_FOUND_PATH = "the server could not find the requested resource"
MSG_INVALID_PATCH = "the server rejected our request due to an error in our request"
MSG_METHOD = "the server does not allow this method on the requested resource"
MSG_EXPIRED = ("The provided continue parameter is too old to display a consistent list result. "
               "You can start a new list without the continue parameter, or use the continue token "
               "in this response to retrieve the remainder of the results. Continuing with the provided "
               "token results in an inconsistent list - objects that were created, modified, or deleted "
               "between the time the first chunk was returned and now may show up in the list.")


class ApiError(Exception):
    def __init__(self, code, reason, message, details=None, headers=None, extra_meta=None):
        super().__init__(message)
        self.code = code
        self.body = {"kind": "Status", "apiVersion": "v1", "metadata": extra_meta or {},
                     "status": "Failure", "message": message, "reason": reason}
        if details is not None:
            self.body["details"] = details
        self.body["code"] = code
        self.headers = headers or {}


def qualified(rt):
    return rt.plural if not rt.group else "%s.%s" % (rt.plural, rt.group)


def res_details(rt, name):
    d = {"name": name}
    if rt.group:
        d["group"] = rt.group
    d["kind"] = rt.plural
    return d


def err_not_found_path():
    return ApiError(404, "NotFound", MSG_NOT_FOUND_PATH, {})


class PageNotFound(ApiError):
    """A path no API group handler claims: kube-apiserver's last handler answers
    it in plain text, not with a Status (a group no CRD or built-in serves, or
    a version or resource of a CRD group that no CRD serves)."""
    def __init__(self):
        super().__init__(404, "NotFound", "404 page not found")
        self.text = b"404 page not found\n"


def err_not_found(rt, name):
    return ApiError(404, "NotFound", '%s "%s" not found' % (qualified(rt), name), res_details(rt, name))


def err_already_exists(rt, name):
    return ApiError(409, "AlreadyExists", '%s "%s" already exists' % (qualified(rt), name),
                    res_details(rt, name))


def err_conflict(rt, name, why="the object has been modified; please apply your changes to the latest version and try again"):
    return ApiError(409, "Conflict", 'Operation cannot be fulfilled on %s "%s": %s' % (qualified(rt), name, why),
                    res_details(rt, name))


def err_bad_request(message):
    return ApiError(400, "BadRequest", message)


def err_invalid(rt, name, causes):
    """causes: list of (field, reason, message) as field.ErrorList renders them."""
    details = {"name": name} if name else {}
    if rt.group:
        details["group"] = rt.group
    details["kind"] = rt.kind
    details["causes"] = [{"reason": r, "message": m, "field": f} for f, r, m in causes]
    text = ", ".join("%s: %s" % (f, m) for f, _, m in causes)
    if len(causes) > 1:
        text = "[" + text + "]"
    return ApiError(422, "Invalid", '%s "%s" is invalid: %s' % (qualified_kind(rt), name, text), details)


def qualified_kind(rt):
    return rt.kind if not rt.group else "%s.%s" % (rt.kind, rt.group)


def err_forbidden(rt, verb, ns, name, sub):
    resource = rt.plural + ("/" + sub if sub else "")
    scope = ' in the namespace "%s"' % ns if ns else " at the cluster scope"
    who = 'User "fake" cannot %s resource "%s" in API group "%s"%s' % (verb, resource, rt.group, scope)
    subject = '%s "%s"' % (qualified(rt), name) if name else qualified(rt)
    d = {}
    if name:
        d["name"] = name
    if rt.group:
        d["group"] = rt.group
    d["kind"] = rt.plural
    return ApiError(403, "Forbidden", "%s is forbidden: %s" % (subject, who), d)
