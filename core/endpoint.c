/*
** cozy.endpoint: the rehearsal's overlay endpoint for a legacy script
** (docs/operations.md, "Rehearsals"). A TLS server of the engine's own:
** a CA and a server certificate for 127.0.0.1 made in memory for this
** endpoint, and a random bearer token. Its listening socket is made by the
** script's child inside the script's network namespace (core/proc.c), so
** the script can reach it and nothing else; the engine accepts on it from
** the host side and serves each request through a Lua function.
**
**   local ep = endpoint.new()    --> a userdata (closed by __gc / ep:close())
**   ep:ca()                      --> the CA certificate, PEM
**   ep:token()                   --> the bearer token (this endpoint's only)
**
** proc.spawn (opts.endpoint) attaches the listening socket and, while the
** script runs, polls it and its connections with the script's output:
** HTTP/1.1 with keep-alive and Content-Length bodies; a request without
** the token is answered 401 here; a chunked request body 400 (not
** supported); every other request is handed to serve{ method=, target=,
** headers = { lower-case name = value }, body = } -> status, content_type,
** body, stop, written back with that status; a true `stop` asks that the
** script be stopped once that answer is given (a run bound to a plan: the
** script made a write the plan does not hold), which proc.spawn does.
** Single-threaded: the Lua state is the runner's, used between two polls.
*/
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "lua.h"
#include "lauxlib.h"

#include "endpoint.h"
#include "host.h"

#define ENDPOINT_MT "cozy.endpoint"
#define MAX_HEADER_BYTES 65536 /* a request's line and headers */
#define MAX_BODY_BYTES (8u << 20) /* a request body: above what the API server takes (3 MiB) */
#define WRITE_TIMEOUT 10 /* seconds an answer may take to be written */

struct conn {
  int fd; /* -1: free slot */
  SSL *ssl;
  int handshaken, want_write, closing;
  char *buf;
  size_t len, cap;
};

struct cozy_endpoint {
  SSL_CTX *ctx;
  char *ca_pem;
  size_t ca_len;
  char token[65];
  int listen_fd;
  int stop; /* serve asked that the script be stopped */
  struct conn conns[COZY_ENDPOINT_MAX_CONNS];
};

/* ---- certificates ---- */

static int add_ext(X509 *cert, X509 *issuer, int nid, const char *value) {
  X509V3_CTX ctx;
  X509_EXTENSION *ext;
  int ok;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, NULL, NULL, 0);
  ext = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
  if (ext == NULL) return 0;
  ok = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  return ok;
}

/* A certificate for key, named cn, signed by issuer_key (issuer: NULL for
** the self-signed CA). NULL on failure. */
static X509 *make_cert(EVP_PKEY *key, const char *cn, X509 *issuer, EVP_PKEY *issuer_key) {
  X509 *cert = X509_new();
  X509_NAME *name;
  unsigned char serial[16];
  BIGNUM *bn = NULL;
  int ok = cert != NULL && RAND_bytes(serial, sizeof serial) == 1;
  serial[0] &= 0x7f; /* positive */
  ok = ok && (bn = BN_bin2bn(serial, sizeof serial, NULL)) != NULL &&
      BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert)) != NULL;
  BN_free(bn);
  ok = ok && X509_set_version(cert, 2) && X509_gmtime_adj(X509_getm_notBefore(cert), -3600) &&
      X509_gmtime_adj(X509_getm_notAfter(cert), 7 * 24 * 3600L) && X509_set_pubkey(cert, key);
  ok = ok && (name = X509_get_subject_name(cert)) != NULL &&
      X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)cn, -1, -1, 0);
  ok = ok && X509_set_issuer_name(cert, issuer ? X509_get_subject_name(issuer) : name);
  if (issuer == NULL) {
    ok = ok && add_ext(cert, cert, NID_basic_constraints, "critical,CA:TRUE") &&
        add_ext(cert, cert, NID_key_usage, "critical,keyCertSign,cRLSign");
  } else {
    ok = ok && add_ext(cert, issuer, NID_basic_constraints, "critical,CA:FALSE") &&
        add_ext(cert, issuer, NID_key_usage, "critical,digitalSignature,keyEncipherment") &&
        add_ext(cert, issuer, NID_ext_key_usage, "serverAuth") &&
        add_ext(cert, issuer, NID_subject_alt_name, "IP:127.0.0.1");
  }
  ok = ok && X509_sign(cert, issuer_key, EVP_sha256()) > 0;
  if (!ok) {
    X509_free(cert);
    return NULL;
  }
  return cert;
}

/* The CA, the server's certificate and key into a server context, the CA
** as PEM and a token; 0, or -1 with everything made so far freed. */
static int endpoint_init(struct cozy_endpoint *ep) {
  EVP_PKEY *ca_key = EVP_EC_gen("P-256"), *key = EVP_EC_gen("P-256");
  X509 *ca = NULL, *cert = NULL;
  BIO *bio = NULL;
  unsigned char raw[32];
  char *data;
  long n;
  int ok, i;
  ok = ca_key != NULL && key != NULL && (ca = make_cert(ca_key, "cozy-migrate rehearsal CA", NULL, ca_key)) &&
      (cert = make_cert(key, "127.0.0.1", ca, ca_key)) != NULL;
  ok = ok && (ep->ctx = SSL_CTX_new(TLS_server_method())) != NULL &&
      SSL_CTX_set_min_proto_version(ep->ctx, TLS1_2_VERSION) && SSL_CTX_use_certificate(ep->ctx, cert) == 1 &&
      SSL_CTX_use_PrivateKey(ep->ctx, key) == 1;
  ok = ok && (bio = BIO_new(BIO_s_mem())) != NULL && PEM_write_bio_X509(bio, ca) == 1 &&
      (n = BIO_get_mem_data(bio, &data)) > 0 && (ep->ca_pem = malloc((size_t)n)) != NULL;
  if (ok) {
    memcpy(ep->ca_pem, data, (size_t)n);
    ep->ca_len = (size_t)n;
  }
  ok = ok && RAND_bytes(raw, sizeof raw) == 1;
  if (ok) {
    for (i = 0; i < (int)sizeof raw; i++) snprintf(ep->token + 2 * i, 3, "%02x", raw[i]);
  }
  OPENSSL_cleanse(raw, sizeof raw);
  BIO_free(bio);
  X509_free(ca);
  X509_free(cert);
  EVP_PKEY_free(ca_key);
  EVP_PKEY_free(key);
  if (!ok) {
    SSL_CTX_free(ep->ctx);
    ep->ctx = NULL;
    free(ep->ca_pem);
    ep->ca_pem = NULL;
    ERR_clear_error();
    return -1;
  }
  return 0;
}

/* ---- connections ---- */

static void conn_close(struct conn *c) {
  if (c->fd < 0) return;
  if (c->ssl) {
    if (c->handshaken) SSL_shutdown(c->ssl);
    SSL_free(c->ssl);
  }
  close(c->fd);
  free(c->buf);
  memset(c, 0, sizeof *c);
  c->fd = -1;
  ERR_clear_error();
}

void cozy_endpoint_detach(struct cozy_endpoint *ep) {
  int i;
  for (i = 0; i < COZY_ENDPOINT_MAX_CONNS; i++) conn_close(&ep->conns[i]);
  if (ep->listen_fd >= 0) close(ep->listen_fd);
  ep->listen_fd = -1;
}

void cozy_endpoint_attach(struct cozy_endpoint *ep, int listen_fd) {
  cozy_endpoint_detach(ep);
  fcntl(listen_fd, F_SETFL, fcntl(listen_fd, F_GETFL) | O_NONBLOCK);
  ep->listen_fd = listen_fd;
}

int cozy_endpoint_fill(const struct cozy_endpoint *ep, struct pollfd *pfd, int max) {
  int i, n = 0;
  if (ep->listen_fd < 0 || max < 1) return 0;
  pfd[n].fd = ep->listen_fd;
  pfd[n].events = POLLIN;
  pfd[n++].revents = 0;
  for (i = 0; i < COZY_ENDPOINT_MAX_CONNS && n < max; i++) {
    const struct conn *c = &ep->conns[i];
    if (c->fd < 0) continue;
    pfd[n].fd = c->fd;
    pfd[n].events = c->want_write ? POLLOUT : POLLIN;
    pfd[n++].revents = 0;
  }
  return n;
}

static void accept_all(struct cozy_endpoint *ep) {
  for (;;) {
    int i, fd = accept4(ep->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    struct conn *c = NULL;
    if (fd < 0) return; /* EAGAIN: none left; any other error: the next poll says */
    for (i = 0; i < COZY_ENDPOINT_MAX_CONNS && c == NULL; i++)
      if (ep->conns[i].fd < 0) c = &ep->conns[i];
    if (c == NULL || (c->ssl = SSL_new(ep->ctx)) == NULL || SSL_set_fd(c->ssl, fd) != 1) {
      /* too many at once: this one is refused, the script's client retries or fails clearly */
      if (c != NULL && c->ssl) SSL_free(c->ssl);
      if (c != NULL) c->ssl = NULL;
      close(fd);
      ERR_clear_error();
      continue;
    }
    c->fd = fd;
  }
}

/* Writes all of s (blocking, bounded by WRITE_TIMEOUT); -1 on failure. */
static int conn_write(struct conn *c, const char *s, size_t n) {
  struct timeval tv = {WRITE_TIMEOUT, 0};
  int flags = fcntl(c->fd, F_GETFL), rc = 0;
  fcntl(c->fd, F_SETFL, flags & ~O_NONBLOCK);
  setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  while (n > 0) {
    int w = SSL_write(c->ssl, s, n > (1u << 30) ? (1 << 30) : (int)n);
    if (w <= 0) {
      rc = -1;
      break;
    }
    s += w;
    n -= (size_t)w;
  }
  fcntl(c->fd, F_SETFL, flags | O_NONBLOCK);
  return rc;
}

static const char *reason_of(int status) {
  switch (status) {
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 406: return "Not Acceptable";
    case 409: return "Conflict";
    case 410: return "Gone";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "Status";
  }
}

static void respond(struct conn *c, int status, const char *ctype, const char *body, size_t len) {
  char head[512];
  int n = snprintf(
      head, sizeof head,
      "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nCache-Control: no-store\r\n%s\r\n",
      status, reason_of(status), ctype, len, c->closing ? "Connection: close\r\n" : "");
  if (n < 0 || (size_t)n >= sizeof head || conn_write(c, head, (size_t)n) != 0 ||
      (len > 0 && conn_write(c, body, len) != 0))
    c->closing = 2; /* cannot be written to: closed */
}

/* A Status of the endpoint's own (not the cluster's). */
static void respond_status(struct conn *c, int status, const char *reason, const char *message) {
  char body[1024];
  int n = snprintf(body, sizeof body,
                   "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\","
                   "\"message\":\"%s\",\"reason\":\"%s\",\"code\":%d}",
                   message, reason, status);
  if (n < 0 || (size_t)n >= sizeof body) n = 0;
  respond(c, status, "application/json", body, (size_t)n);
}

/* ---- requests ---- */

struct request {
  const char *method, *target;
  size_t method_len, target_len;
  const char *head; /* the header lines */
  size_t head_len;
  const char *body;
  size_t body_len;
};

/* The value of header `name` in the head (case-insensitive), or NULL. */
static const char *header(const struct request *r, const char *name, size_t *len) {
  const char *p = r->head, *end = r->head + r->head_len;
  size_t nl = strlen(name);
  while (p < end) {
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    const char *line_end = eol ? eol : end;
    if ((size_t)(line_end - p) > nl && p[nl] == ':' && strncasecmp(p, name, nl) == 0) {
      const char *v = p + nl + 1, *e = line_end;
      while (v < e && (*v == ' ' || *v == '\t')) v++;
      while (e > v && (e[-1] == '\r' || e[-1] == ' ' || e[-1] == '\t')) e--;
      *len = (size_t)(e - v);
      return v;
    }
    p = eol ? eol + 1 : end;
  }
  return NULL;
}

/* Runs protected: serve{ method, target, headers, body } -> status, ctype, body, stop */
static int call_serve(lua_State *L) {
  const struct request *r = lua_touserdata(L, 2);
  const char *p = r->head, *end = r->head + r->head_len;
  lua_pushvalue(L, 1);
  lua_createtable(L, 0, 4);
  lua_pushlstring(L, r->method, r->method_len);
  lua_setfield(L, -2, "method");
  lua_pushlstring(L, r->target, r->target_len);
  lua_setfield(L, -2, "target");
  lua_pushlstring(L, r->body, r->body_len);
  lua_setfield(L, -2, "body");
  lua_newtable(L);
  while (p < end) {
    const char *eol = memchr(p, '\n', (size_t)(end - p)), *line_end = eol ? eol : end;
    const char *colon = memchr(p, ':', (size_t)(line_end - p));
    if (colon != NULL) {
      const char *v = colon + 1, *e = line_end;
      luaL_Buffer b;
      const char *k;
      while (v < e && (*v == ' ' || *v == '\t')) v++;
      while (e > v && (e[-1] == '\r' || e[-1] == ' ' || e[-1] == '\t')) e--;
      luaL_buffinit(L, &b);
      for (k = p; k < colon; k++) luaL_addchar(&b, (char)((*k >= 'A' && *k <= 'Z') ? *k + 32 : *k));
      luaL_pushresult(&b);
      lua_pushlstring(L, v, (size_t)(e - v));
      lua_settable(L, -3);
    }
    p = eol ? eol + 1 : end;
  }
  lua_setfield(L, -2, "headers");
  lua_call(L, 1, 4);
  return 4;
}

static void serve_one(lua_State *L, struct cozy_endpoint *ep, struct conn *c, const struct request *r,
                      int serve, int errslot) {
  size_t alen = 0, blen = 0;
  const char *auth = header(r, "Authorization", &alen), *out;
  char expect[80];
  int n = snprintf(expect, sizeof expect, "Bearer %s", ep->token), status;
  if (auth == NULL || alen != (size_t)n || CRYPTO_memcmp(auth, expect, (size_t)n) != 0) {
    respond_status(c, 401, "Unauthorized", "the engine's endpoint wants its own bearer token");
    return;
  }
  if (!lua_checkstack(L, 6)) {
    respond_status(c, 500, "InternalError", "out of stack");
    return;
  }
  lua_pushcfunction(L, call_serve);
  lua_pushvalue(L, serve);
  lua_pushlightuserdata(L, (void *)r);
  if (lua_pcall(L, 2, 4, 0) != LUA_OK) {
    if (lua_isnil(L, errslot)) lua_replace(L, errslot);
    else lua_pop(L, 1);
    respond_status(c, 500, "InternalError", "the engine's endpoint failed: see the engine's log");
    return;
  }
  if (lua_toboolean(L, -1)) ep->stop = 1;
  lua_pop(L, 1);
  status = (int)lua_tointeger(L, -3);
  out = lua_tolstring(L, -1, &blen);
  if (status < 100 || status > 599) status = 500;
  respond(c, status, lua_isstring(L, -2) ? lua_tostring(L, -2) : "application/json", out ? out : "",
          out ? blen : 0);
  lua_pop(L, 3);
}

/* The complete requests in c's buffer, each served in turn. */
static void serve_buffered(lua_State *L, struct cozy_endpoint *ep, struct conn *c, int serve, int errslot) {
  while (c->closing == 0 && c->len > 0) {
    struct request r;
    char *end = memmem(c->buf, c->len, "\r\n\r\n", 4), *sp1, *sp2, *line_end;
    size_t head_len, clen = 0, vlen;
    const char *v;
    /* the bound holds however the request arrived: whole in one read, or in pieces */
    if (end == NULL || (size_t)(end - c->buf) + 4 > MAX_HEADER_BYTES) {
      if (end != NULL || c->len > MAX_HEADER_BYTES) {
        c->closing = 1;
        respond_status(c, 431, "RequestHeaderFieldsTooLarge", "the request's headers are too large");
      }
      return;
    }
    head_len = (size_t)(end - c->buf) + 4;
    line_end = memchr(c->buf, '\r', head_len);
    sp1 = memchr(c->buf, ' ', (size_t)(line_end - c->buf));
    sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t)(line_end - sp1 - 1)) : NULL;
    if (sp1 == NULL || sp2 == NULL) {
      c->closing = 1;
      respond_status(c, 400, "BadRequest", "malformed request line");
      return;
    }
    memset(&r, 0, sizeof r);
    r.method = c->buf;
    r.method_len = (size_t)(sp1 - c->buf);
    r.target = sp1 + 1;
    r.target_len = (size_t)(sp2 - sp1 - 1);
    r.head = line_end + 2;
    r.head_len = (size_t)(end + 2 - r.head);
    if ((v = header(&r, "Transfer-Encoding", &vlen)) != NULL) {
      c->closing = 1;
      respond_status(c, 400, "BadRequest",
                     "the engine's endpoint does not take chunked request bodies: send a Content-Length");
      return;
    }
    if ((v = header(&r, "Content-Length", &vlen)) != NULL) {
      size_t i;
      for (i = 0; i < vlen; i++) {
        if (v[i] < '0' || v[i] > '9' || clen > MAX_BODY_BYTES) break;
        clen = clen * 10 + (size_t)(v[i] - '0');
      }
      if (i < vlen || vlen == 0 || clen > MAX_BODY_BYTES) {
        c->closing = 1;
        respond_status(c, 413, "RequestEntityTooLarge", "bad or too large Content-Length");
        return;
      }
    }
    if (c->len < head_len + clen) return; /* the body is still coming */
    r.body = c->buf + head_len;
    r.body_len = clen;
    if ((v = header(&r, "Connection", &vlen)) != NULL && vlen == 5 && strncasecmp(v, "close", 5) == 0)
      c->closing = 1;
    if (header(&r, "Upgrade", &vlen) != NULL) c->closing = 1; /* never upgraded: answered, then closed */
    serve_one(L, ep, c, &r, serve, errslot);
    memmove(c->buf, c->buf + head_len + clen, c->len - head_len - clen);
    c->len -= head_len + clen;
  }
}

/* What can be read now, into the buffer; 0, or -1 when the connection ended. */
static int conn_read(struct conn *c) {
  for (;;) {
    int n, err;
    if (c->cap - c->len < 16384) {
      size_t cap = c->cap ? c->cap * 2 : 65536;
      char *buf;
      if (cap > MAX_HEADER_BYTES + MAX_BODY_BYTES + 65536) return -1;
      if ((buf = realloc(c->buf, cap)) == NULL) return -1;
      c->buf = buf;
      c->cap = cap;
    }
    n = SSL_read(c->ssl, c->buf + c->len, (int)(c->cap - c->len));
    if (n > 0) {
      c->len += (size_t)n;
      continue;
    }
    err = SSL_get_error(c->ssl, n);
    if (err == SSL_ERROR_WANT_READ) return 0;
    return -1;
  }
}

void cozy_endpoint_handle(lua_State *L, struct cozy_endpoint *ep, const struct pollfd *pfd, int n, int serve,
                          int errslot) {
  int i, k;
  for (k = 0; k < n; k++) {
    if (pfd[k].revents == 0) continue;
    if (pfd[k].fd == ep->listen_fd) {
      accept_all(ep);
      continue;
    }
    for (i = 0; i < COZY_ENDPOINT_MAX_CONNS; i++) {
      struct conn *c = &ep->conns[i];
      if (c->fd != pfd[k].fd) continue;
      if (!c->handshaken) {
        int rc = SSL_accept(c->ssl), err;
        if (rc == 1) {
          c->handshaken = 1;
          c->want_write = 0;
        } else {
          err = SSL_get_error(c->ssl, rc);
          if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
            c->want_write = err == SSL_ERROR_WANT_WRITE;
            break;
          }
          conn_close(c); /* a failed handshake (the wrong CA, not TLS at all) */
          break;
        }
      }
      {
        int ended = conn_read(c);
        serve_buffered(L, ep, c, serve, errslot);
        if (ended != 0 || c->closing) conn_close(c);
      }
      break;
    }
  }
}

int cozy_endpoint_stopping(const struct cozy_endpoint *ep) {
  return ep->stop;
}

const char *cozy_endpoint_ca(const struct cozy_endpoint *ep, size_t *len) {
  *len = ep->ca_len;
  return ep->ca_pem;
}

const char *cozy_endpoint_token(const struct cozy_endpoint *ep, size_t *len) {
  *len = strlen(ep->token);
  return ep->token;
}

/* ---- Lua ---- */

struct cozy_endpoint *cozy_endpoint_check(lua_State *L, int idx) {
  struct cozy_endpoint *ep = luaL_checkudata(L, idx, ENDPOINT_MT);
  if (ep->ctx == NULL) luaL_argerror(L, idx, "endpoint is closed");
  return ep;
}

static int ep_close(lua_State *L) {
  struct cozy_endpoint *ep = luaL_checkudata(L, 1, ENDPOINT_MT);
  cozy_endpoint_detach(ep);
  SSL_CTX_free(ep->ctx);
  ep->ctx = NULL;
  free(ep->ca_pem);
  ep->ca_pem = NULL;
  OPENSSL_cleanse(ep->token, sizeof ep->token);
  return 0;
}

static int ep_new(lua_State *L) {
  struct cozy_endpoint *ep = lua_newuserdatauv(L, sizeof *ep, 0);
  int i;
  memset(ep, 0, sizeof *ep);
  ep->listen_fd = -1;
  for (i = 0; i < COZY_ENDPOINT_MAX_CONNS; i++) ep->conns[i].fd = -1;
  luaL_setmetatable(L, ENDPOINT_MT); /* from here __gc frees what init makes */
  if (endpoint_init(ep) != 0) return luaL_error(L, "the engine's endpoint: cannot make its certificates");
  return 1;
}

static int ep_ca(lua_State *L) {
  struct cozy_endpoint *ep = cozy_endpoint_check(L, 1);
  lua_pushlstring(L, ep->ca_pem, ep->ca_len);
  return 1;
}

static int ep_token(lua_State *L) {
  struct cozy_endpoint *ep = cozy_endpoint_check(L, 1);
  lua_pushstring(L, ep->token);
  return 1;
}

static const luaL_Reg ep_methods[] = {{"ca", ep_ca}, {"token", ep_token}, {"close", ep_close}, {NULL, NULL}};
static const luaL_Reg ep_funcs[] = {{"new", ep_new}, {NULL, NULL}};

int luaopen_cozy_endpoint(lua_State *L) {
  if (luaL_newmetatable(L, ENDPOINT_MT)) {
    lua_pushcfunction(L, ep_close);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, ep_close);
    lua_setfield(L, -2, "__close");
    luaL_newlib(L, ep_methods);
    lua_setfield(L, -2, "__index");
  }
  lua_pop(L, 1);
  luaL_newlib(L, ep_funcs);
  return 1;
}
