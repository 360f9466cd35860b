"""The command line (spec/support/README.md, "Command line"): arguments,
fixtures, TLS material made with openssl at start, the kubeconfig and ready
file, signals; then serve until TERM."""

import argparse
import base64
import http.client
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile

from fakeapi.routing import Api
from fakeapi.server import Handler, Server, fast_parse_headers
from fakeapi.store import State, load_fixture_text
from fakeapi.util import write_atomic

# --help's description: the first line of the fake-apiserver script's docstring
DESCRIPTION = "A faithful fake Kubernetes API server for cozy-migrate's tests."


def make_tls(tmp):
    def run(*args):
        subprocess.run(["openssl"] + list(args), cwd=tmp, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "3", "-subj", "/CN=fake-apiserver-ca",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    run("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    with open(os.path.join(tmp, "ext.cnf"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\nbasicConstraints=CA:FALSE\n"
                "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.crt", "-days", "3", "-extfile", "ext.cnf")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(os.path.join(tmp, "server.crt"), os.path.join(tmp, "server.key"))
    ctx.set_alpn_protocols(["http/1.1"])
    with open(os.path.join(tmp, "ca.crt"), "rb") as f:
        return ctx, f.read()


def kubeconfig(url, ca_pem, token):
    q = json.dumps
    lines = ["apiVersion: v1", "kind: Config", "clusters:", "- name: fake", "  cluster:",
             "    server: " + q(url)]
    if ca_pem:
        lines.append("    certificate-authority-data: " + q(base64.b64encode(ca_pem).decode()))
    lines += ["users:", "- name: fake"]
    lines += ["  user:", "    token: " + q(token)] if token is not None else ["  user: {}"]
    lines += ["contexts:", "- name: fake", "  context:", "    cluster: fake", "    user: fake",
              "current-context: fake", "preferences: {}", ""]
    return "\n".join(lines)


def parse_deny(s):
    parts = s.split(":")
    if len(parts) != 3 or not parts[0] or not parts[2]:
        raise argparse.ArgumentTypeError("--deny wants VERB:GROUP:RESOURCE, got %r" % s)
    return {"verb": parts[0], "group": parts[1], "resource": parts[2]}


def main(argv):
    http.client.parse_headers = fast_parse_headers   # used by http.server's parse_request
    p = argparse.ArgumentParser(prog="fake-apiserver", description=DESCRIPTION)
    p.add_argument("--fixture", action="append", default=[], help="JSON v1 List file (repeatable)")
    p.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT, port 0 picks a free one")
    p.add_argument("--tls", action="store_true", help="serve HTTPS with a CA generated at start")
    p.add_argument("--token", help="require this bearer token on API requests")
    p.add_argument("--kubeconfig-out", help="write a kubeconfig for this server here")
    p.add_argument("--ca-out", help="write the CA certificate (PEM) here (with --tls)")
    p.add_argument("--ready-file", help="write the base URL here once listening")
    p.add_argument("--latency-ms", type=float, default=0, help="delay every API request")
    p.add_argument("--max-log", type=int, default=200000, help="keep at most this many request log entries")
    p.add_argument("--deny", action="append", default=[], type=parse_deny, help="VERB:GROUP:RESOURCE ('*' matches any)")
    args = p.parse_args(argv)

    items = []
    try:
        for path in args.fixture:
            with open(path, encoding="utf-8") as f:
                items.extend(load_fixture_text(f.read()))
        state = State(args.deny)
        state.reset(items)
    except (OSError, ValueError) as e:
        sys.stderr.write("fake-apiserver: bad fixture: %s\n" % e)
        return 2

    host, _, port = args.listen.rpartition(":")
    ssl_ctx, ca_pem = None, None
    if args.tls:
        tmp = tempfile.mkdtemp(prefix="fake-apiserver-")
        try:
            ssl_ctx, ca_pem = make_tls(tmp)
        except subprocess.CalledProcessError as e:
            sys.stderr.write("fake-apiserver: openssl failed: %s\n" % e.stderr.decode(errors="replace"))
            return 2
        finally:
            # keys and certificates are in memory now: nothing is left behind, even
            # when the server is killed with SIGKILL
            shutil.rmtree(tmp, ignore_errors=True)
    server = Server((host or "127.0.0.1", int(port or 0)), Handler)
    server.ssl_ctx = ssl_ctx
    server.state = state
    server.token = args.token
    server.latency = args.latency_ms / 1000.0
    server.stopping = False
    server.max_log = max(1, args.max_log)
    url = "%s://%s:%d" % ("https" if args.tls else "http", host or "127.0.0.1", server.server_address[1])
    server.api = Api(state, lambda: url)

    def stop(signum, frame):
        raise KeyboardInterrupt
    # installed before the ready file exists: whoever saw it may TERM us at once
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        if args.ca_out and ca_pem:
            write_atomic(args.ca_out, ca_pem)
        if args.kubeconfig_out:
            write_atomic(args.kubeconfig_out, kubeconfig(url, ca_pem, args.token))
        if args.ready_file:
            write_atomic(args.ready_file, url)
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.stopping = True
        server.server_close()
    return 0
