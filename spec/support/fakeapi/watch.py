"""Watch: a chunked stream of JSON events from the store's history (a synthetic
ADDED per object when no resourceVersion is given), until the client goes away
or timeoutSeconds passes."""

import time

from fakeapi.errors import ApiError
from fakeapi.resources import versioned
from fakeapi.selectors import fields_match, labels_match, parse_field_selector, parse_label_selector
from fakeapi.util import dumps


class WatchMixin:
    """The Handler's watch stream (fakeapi.server.Handler)."""

    def serve_watch(self, req, entry, rt, version, ns, name):
        """Watch as a chunked stream of JSON events (enough for kubectl delete/wait and
        informer-style clients); events after ?resourceVersion= are replayed from memory."""
        state = self.server.state
        try:
            timeout = float(req.q("timeoutSeconds") or 1800)
        except ValueError:
            timeout = 1800
        fields = parse_field_selector(req.q("fieldSelector", ""))
        labels = parse_label_selector(req.q("labelSelector", ""))
        key = (rt.group, rt.plural)
        since = req.q("resourceVersion")
        with state.lock:
            if since not in (None, "", "0"):
                try:
                    since = int(since)
                except ValueError:
                    raise ApiError(400, "BadRequest", 'invalid resourceVersion "%s"' % since)
                pending = [e for e in state.history if e[1] > since and e[2] == key]
            else:
                # no resourceVersion: "get state and start at most recent", a synthetic
                # ADDED for every current object first, as the real watch cache does
                current = sorted(state.objects.get(key, {}).items())
                pending = [(0, 0, key, "ADDED", o) for _, o in current]
            last = state.seq
        entry["status"] = 200
        self.close_connection = True
        head = ["HTTP/1.1 200 OK", "Content-Type: application/json", "Transfer-Encoding: chunked",
                "Cache-Control: no-cache, private", "Connection: close"]
        deadline = time.monotonic() + timeout

        def chunk(data):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        try:
            self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode())
            while not self.server.stopping:
                for _, _, _, event, obj in pending:
                    meta = obj.get("metadata", {})
                    if ns is not None and meta.get("namespace") != ns:
                        continue
                    if name is not None and meta.get("name") != name:
                        continue
                    if fields and not fields_match(fields, meta):
                        continue
                    if labels and not labels_match(labels, meta.get("labels") or {}):
                        continue
                    chunk(dumps({"type": event, "object": versioned(rt, version, obj)}) + b"\n")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                with state.lock:
                    if state.seq == last:
                        state.cond.wait(min(0.5, remaining))
                    pending = [e for e in state.history if e[0] > last and e[2] == key]
                    last = state.seq
            chunk(b"")
        except OSError:
            pass
