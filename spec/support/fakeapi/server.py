"""HTTP transport: the threaded HTTP(S) server, fast header parsing, the request
handler (request log entry, token check, fault rule, then the API or a control
endpoint) and how it writes answers."""

import base64
import http.client
import http.server
import socket
import socketserver
import ssl
import struct
import sys
import time
import urllib.parse

from fakeapi.control import control
from fakeapi.errors import ApiError, PageNotFound
from fakeapi.faults import FaultsMixin
from fakeapi.routing import Request
from fakeapi.util import dumps
from fakeapi.watch import WatchMixin

class FastHeaders(dict):
    """Request headers, case-insensitive; the stdlib's email-parser based parsing is the
    single largest cost of a GET, and a fake API server needs none of its generality."""
    def get(self, name, default=None):
        return dict.get(self, name.lower(), default)

    def __getitem__(self, name):
        return dict.get(self, name.lower())

    def __contains__(self, name):
        return dict.__contains__(self, name.lower())

    def get_all(self, name):
        """Every value of a repeated header (Impersonate-Group, -Extra-*),
        in order; dict keeps the last."""
        return getattr(self, "repeated", {}).get(name.lower())


def fast_parse_headers(fp, _class=None):
    headers = FastHeaders()
    for _ in range(101):
        line = fp.readline(65537)
        if len(line) > 65536:
            raise http.client.LineTooLong("header line")
        if line in (b"\r\n", b"\n", b""):
            return headers
        name, _, value = line.decode("iso-8859-1").partition(":")
        name, value = name.strip().lower(), value.strip()
        if name.startswith("impersonate-"):
            if not hasattr(headers, "repeated"):
                headers.repeated = {}
            headers.repeated.setdefault(name, []).append(value)
        headers[name] = value
    raise http.client.HTTPException("got more than 100 headers")


class Handler(FaultsMixin, WatchMixin, http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY, as kube-apiserver (Go) sets it: with Nagle on, a response
    # written right after a new TLS connection's handshake waits ~40 ms for
    # the client's delayed ACK, which would make every fresh-connection write
    # look slow in benchmarks.
    disable_nagle_algorithm = True
    server_version = "fake-apiserver"
    sys_version = ""

    def setup(self):
        if self.server.ssl_ctx is not None:
            self.request.settimeout(30)
            self.request = self.server.ssl_ctx.wrap_socket(self.request, server_side=True)
            self.request.settimeout(None)
        super().setup()

    def log_message(self, *args):
        pass

    def read_body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n > 0 else b""

    def send(self, code, headers, body):
        reason = http.server.BaseHTTPRequestHandler.responses.get(code, ("Unknown",))[0]
        lines = ["HTTP/1.1 %d %s" % (code, reason), "Content-Length: %d" % len(body),
                 "Cache-Control: no-cache, private", "Date: " + self.date_time_string()]
        for k, v in headers.items():
            lines.append("%s: %s" % (k, v))
        if self.close_connection:
            lines.append("Connection: close")
        self.wfile.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)

    def do_GET(self):
        self.dispatch()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = do_GET

    def serve_control(self, body):
        try:
            code, headers, out = self.server.control(self.command, self.path, body)
        except ApiError as e:
            code, headers, out = e.code, {"Content-Type": "application/json"}, dumps(e.body)
        except Exception as e:  # a bad control request must not kill the server
            code, headers, out = 400, {"Content-Type": "application/json"}, dumps({"error": str(e)})
        self.send(code, headers, out)

    def log_request(self, req, body):
        """The request's entry in the request log (GET /_fake/requests), appended;
        the status and any fault are filled in as the request is served."""
        entry = {"method": self.command, "path": req.path,
                 "query": urllib.parse.urlsplit(self.path).query,
                 "content_type": self.headers.get("Content-Type"),
                 "body": None,
                 "status": None, "user_agent": self.headers.get("User-Agent"),
                 "at": time.time(),
                 "conn": "%s:%d" % tuple(self.client_address[:2])}
        if req.impersonate is not None:
            entry["impersonate"] = req.impersonate
        if body:
            try:
                entry["body"] = body.decode("utf-8")
            except UnicodeDecodeError:   # protobuf: keep it exact
                entry["body_base64"] = base64.b64encode(body).decode()
        srv = self.server
        state = srv.state
        with state.lock:
            state.log.append(entry)
            if len(state.log) > srv.max_log:
                del state.log[:len(state.log) - srv.max_log]
        return entry

    def dispatch(self):
        srv = self.server
        body = self.read_body()
        if self.path.startswith("/_fake/"):
            self.serve_control(body)
            return
        req = Request(self.command, self.path, self.headers, body)
        entry = self.log_request(req, body)
        if srv.latency:
            time.sleep(srv.latency)
        headers = {}
        try:
            if srv.token is not None and self.headers.get("Authorization") != "Bearer " + srv.token:
                raise ApiError(401, "Unauthorized", "Unauthorized")
            rule = self.take_fault(req, entry)
            if rule is not None and self.apply_fault(rule, req, entry):
                return
            result = srv.api.handle(req)
            if result[0] == "watch":
                self.serve_watch(req, entry, *result[1:])
                return
            code, headers, out = result
            if rule is not None and rule.get("continue"):
                out = self.misdirect(req, rule["continue"], code, out, entry)
        except PageNotFound as e:
            code, out = e.code, e.text
            headers = {"Content-Type": "text/plain; charset=utf-8"}
        except ApiError as e:
            code, out = e.code, dumps(e.body)
            headers = {"Content-Type": "application/json"}
            headers.update(e.headers)
        except Exception as e:  # an internal error answers 500, as the real server would
            code = 500
            out = dumps(ApiError(500, "InternalError", "an error on the server (%r) has prevented the request "
                                 "from succeeding" % (e,), {}).body)
            headers = {"Content-Type": "application/json"}
            sys.stderr.write("fake-apiserver: internal error on %s %s: %r\n" % (self.command, self.path, e))
        entry["status"] = code
        if self.command == "HEAD":
            out = b""
        self.send(code, headers, out)

    def drop(self):
        self.close_connection = True
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        try:
            self.connection.close()
        except OSError:
            pass


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def handle_error(self, request, client_address):
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, ssl.SSLError, socket.timeout, OSError)):
            return
        super().handle_error(request, client_address)

    def control(self, method, target, body):
        return control(self, method, target, body)
