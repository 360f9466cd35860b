/*
** One HTTP exchange over a libcurl easy handle of the client, following curl's
** own examples: one error buffer per handle, CURLINFO_RESPONSE_CODE rather
** than CURLOPT_FAILONERROR (error bodies are metav1.Status objects we want),
** NOSIGNAL (threads), connect and total timeouts, stall detection, TCP
** keepalive, and peer verification always on unless the kubeconfig itself
** says insecure-skip-tls-verify. Every handle of a client is in one share
** (CURLSH): connections, TLS sessions and DNS answers are reused across
** t:request and batches.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <openssl/crypto.h>
#include <openssl/x509.h>

#include "proxy.h"
#include "transport.h"

#ifndef COZY_MIGRATE_VERSION
#define COZY_MIGRATE_VERSION "0.0.0-dev"
#endif

/* Token bucket: `burst` requests at once, then `qps` per second. Retries
** take a token too: they are load on the apiserver like any request. */
double cozy_ratelimit_take(struct cozy_transport *t, double now) {
  if (t->qps <= 0) return 0;
  t->tokens += (now - t->refilled_at) * t->qps;
  if (t->tokens > t->burst) t->tokens = t->burst;
  t->refilled_at = now;
  if (t->tokens < 1) return (1 - t->tokens) / t->qps;
  t->tokens -= 1;
  return 0;
}

/* The wait ends early when the caller's watch says stop (no token is taken). */
int cozy_ratelimit_wait(struct cozy_transport *t, double *detail) {
  for (;;) {
    double wait = cozy_ratelimit_take(t, cozy_monotime());
    int r;
    if (wait <= 0) return COZY_GO;
    r = cozy_watch_sleep(t->watch, wait, detail);
    if (r != COZY_GO) return r;
  }
}

int cozy_http_reload_token(struct cozy_transport *t) {
  struct cozy_blob fresh = {NULL, 0};
  if (t->kc.exec != NULL) {
    /* a new credential from the plugin, or the old one kept (a message) */
    /* expired: another client may have renewed it already; still valid:
    ** a 401 said it is not, so the plugin runs again */
    int renew = !cozy_exec_expired(t->kc.exec);
    t->token_read_at = cozy_monotime();
    if (cozy_exec_run(t->kc.exec, &t->kc, renew, t->watch, t->cred_error, sizeof t->cred_error) != 0)
      return -1;
    t->cred_error[0] = '\0';
    t->cred_gen++;
    return 0;
  }
  if (t->kc.token_file == NULL) return 0;
  t->token_read_at = cozy_monotime();
  if (cozy_read_file(t->kc.token_file, COZY_MAX_TOKEN_BYTES, &fresh) != 0) return -1;
  cozy_blob_rtrim(&fresh);
  if (fresh.len == 0 || cozy_token_invalid(&fresh)) {
    /* a file being rewritten, or one that would inject headers: keep the
    ** token we have (it was valid when loaded) */
    cozy_blob_free(&fresh);
    return -1;
  }
  cozy_blob_free(&t->kc.token);
  t->kc.token = fresh;
  return 0;
}

/* The drivers own credentials: t:request's loop and the batch driver call
** these around the retry judge (transport_retry.c), which only decides. */

double cozy_attempt_begin(struct cozy_transport *t, const struct cozy_attempts *a) {
  double left;
  if (t->kc.exec != NULL) {
    /* client-go: the plugin's credential is kept until its
    ** expirationTimestamp (none: until a 401) */
    if (cozy_exec_expired(t->kc.exec)) cozy_http_reload_token(t);
  } else if (t->kc.token_file && t->token_refresh > 0 &&
             cozy_monotime() - t->token_read_at >= t->token_refresh)
    cozy_http_reload_token(t);
  /* what is left of the attempt's time; never 0, which libcurl reads as "no timeout" */
  left = a->deadline > 0 ? a->deadline - cozy_monotime() : 0;
  if (a->deadline > 0 && left < 0.002) left = 0.002;
  return left;
}

enum cozy_after cozy_refresh_after_401(lua_State *L, struct cozy_transport *t) {
  if (cozy_http_reload_token(t) != 0 && t->kc.exec != NULL) {
    /* the plugin failed: the 401 stands, with the plugin's reason (a token
    ** file that cannot be read keeps the old token: it was valid when read) */
    lua_pushstring(L, t->cred_error);
    lua_setfield(L, -2, "credential_error");
    return COZY_AFTER_DONE;
  }
  return COZY_AFTER_REPLAY;
}

/* libcurl hands over the body as decoded (gunzipped, de-chunked), so the
** limit here counts what we keep, whatever the framing or the encoding. */
size_t cozy_http_on_body(char *ptr, size_t size, size_t nmemb, void *ud) {
  struct cozy_response *t = ud;
  size_t n = size * nmemb;
  if (n > t->max_response_bytes - t->body_len) {
    t->body_too_large = 1;
    return 0; /* aborts the transfer with CURLE_WRITE_ERROR */
  }
  if (t->body_len + n + 1 > t->body_cap) {
    size_t cap = t->body_cap ? t->body_cap : 16384;
    char *nb;
    while (cap < t->body_len + n + 1) cap *= 2;
    if (cap > t->max_response_bytes + 1) cap = t->max_response_bytes + 1;
    nb = realloc(t->body, cap);
    if (nb == NULL) return 0; /* aborts the transfer with CURLE_WRITE_ERROR */
    t->body = nb;
    t->body_cap = cap;
  }
  memcpy(t->body + t->body_len, ptr, n);
  t->body_len += n;
  t->body[t->body_len] = '\0';
  if (t->end_at_line && memchr(ptr, '\n', n) != NULL) {
    t->ended_at_line = 1; /* cozy_exchange_finish makes this abort an answer */
    return 0;
  }
  return n;
}

size_t cozy_http_on_header(char *buf, size_t size, size_t nitems, void *ud) {
  struct cozy_response *t = ud;
  size_t n = size * nitems;
  static const char name[] = "retry-after:";
  if (n > sizeof name - 1 && strncasecmp(buf, name, sizeof name - 1) == 0) {
    char tmp[64];
    size_t len = n - (sizeof name - 1);
    char *end;
    double v;
    if (len >= sizeof tmp) len = sizeof tmp - 1;
    memcpy(tmp, buf + sizeof name - 1, len);
    tmp[len] = '\0';
    v = strtod(tmp, &end);
    /* seconds only; an HTTP date is not sent by the apiserver */
    if (end != tmp && v >= 0) t->retry_after = v;
  } else if (n > 8 && strncasecmp(buf, "warning:", 8) == 0) {
    /* deprecation notices and the like (RFC 7234 warn-code 299): kept for the log */
    size_t len = n - 8;
    const char *v = buf + 8;
    while (len > 0 && (*v == ' ' || *v == '\t')) {
      v++;
      len--;
    }
    while (len > 0 && (v[len - 1] == '\r' || v[len - 1] == '\n' || v[len - 1] == ' ')) len--;
    if (len > 0 && t->warnings_len + len + 1 < sizeof t->warnings) {
      memcpy(t->warnings + t->warnings_len, v, len);
      t->warnings_len += len;
      t->warnings[t->warnings_len++] = '\n';
      t->warnings[t->warnings_len] = '\0';
    }
  } else if (n >= 5 && strncmp(buf, "HTTP/", 5) == 0) {
    t->retry_after = -1; /* a new response (after a redirect or 100) */
    t->warnings_len = 0;
    t->warnings[0] = '\0';
  }
  return n;
}

void cozy_response_reset(struct cozy_response *r) {
  r->body_len = 0;
  r->body_too_large = 0;
  r->ended_at_line = 0;
  if (r->body) r->body[0] = '\0';
  r->retry_after = -1;
  r->warnings_len = 0;
  r->warnings[0] = '\0';
}

void cozy_response_free(struct cozy_response *r) {
  if (r->body) {
    OPENSSL_cleanse(r->body, r->body_cap);
    free(r->body);
  }
  r->body = NULL;
  r->body_len = r->body_cap = 0;
}

/* Every curl_easy_setopt result goes through here (CHECK_SETOPT): an option
** this libcurl lacks or refuses (a CA or client-certificate blob its TLS
** backend cannot take, a bad value) must fail the request with a message
** naming the option, not send a request weaker than the one configured. The
** first failure is kept; the callers check t->setopt_rc after their batch. */
static void check_setopt(struct cozy_exchange *t, const char *name, CURLcode rc) {
  if (rc == CURLE_OK || t->setopt_rc != CURLE_OK) return;
  t->setopt_rc = rc;
  snprintf(t->errbuf, sizeof t->errbuf, "curl_easy_setopt(%s) failed: %s", name, curl_easy_strerror(rc));
}
#define CHECK_SETOPT(t, opt, val) check_setopt((t), #opt, curl_easy_setopt((t)->curl, opt, val))

/* Seconds to the milliseconds curl takes, clamped: (long) of a double beyond
** LONG_MAX is undefined (x86 gives LONG_MIN, which curl refuses). */
static long to_ms(double seconds) {
  double ms = seconds * 1000;
  if (!(ms > 0)) return 0;
  if (ms > 1e12) return 1000000000000L; /* some 31 years: no limit, in effect */
  return (long)ms;
}

/* Called by libcurl often during a transfer and about once a second when it
** idles (a signal interrupting its poll wakes it early): a non-zero answer
** aborts the transfer with CURLE_ABORTED_BY_CALLBACK; t->stop says why. */
static int on_progress(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal, curl_off_t ulnow) {
  struct cozy_exchange *t = ud;
  (void)dltotal;
  (void)dlnow;
  (void)ultotal;
  (void)ulnow;
  t->stop = cozy_watch_poll(t->watch, cozy_monotime(), &t->stop_detail);
  return t->stop != COZY_GO;
}

/* The kubeconfig's proxy-url for libcurl: socks5:// resolves names on the
** proxy, as client-go's SOCKS5 dialer hands it the host name (socks5h). */
static char *proxy_url(const char *url) {
  size_t n = strlen(url) + 2;
  char *p = malloc(n);
  if (p == NULL) return NULL;
  if (strncmp(url, "socks5://", 9) == 0) snprintf(p, n, "socks5h://%s", url + 9);
  else snprintf(p, n, "%s", url);
  return p;
}

/* t->base, and with tls-server-name the route to the real address (see
** transport.h). 0, or -1 when memory runs out. */
static int route(struct cozy_transport *t) {
  const char *server = t->kc.server, *scheme_end = strstr(server, "://"), *hp, *end, *host_end, *port;
  char line[1024];
  size_t hostlen;
  if (t->kc.tls_server_name == NULL || scheme_end == NULL) {
    t->base = strdup(server);
    return t->base ? 0 : -1;
  }
  hp = scheme_end + 3;
  end = hp + strcspn(hp, "/");
  if (*hp == '[') { /* an IPv6 literal: the port comes after the bracket */
    host_end = memchr(hp, ']', (size_t)(end - hp));
    host_end = host_end ? host_end + 1 : end;
  } else {
    host_end = hp + strcspn(hp, ":/");
  }
  if (host_end > end) host_end = end;
  hostlen = (size_t)(host_end - hp);
  port = (*host_end == ':') ? host_end + 1 : (strncmp(server, "https", 5) == 0 ? "443" : "80");
  {
    int portlen = (*host_end == ':') ? (int)(end - port) : (int)strlen(port);
    size_t n = strlen(server) + strlen(t->kc.tls_server_name) + 16;
    t->base = malloc(n);
    if (t->base == NULL) return -1;
    snprintf(t->base, n, "%.*s%s:%.*s%s", (int)(hp - server), server, t->kc.tls_server_name, portlen, port,
             end);
    snprintf(line, sizeof line, "%s:%.*s:%.*s:%.*s", t->kc.tls_server_name, portlen, port, (int)hostlen, hp,
             portlen, port);
    t->connect_to = curl_slist_append(NULL, line);
    n = (size_t)(end - hp) + sizeof "Host: ";
    t->host_header = malloc(n);
    if (t->connect_to == NULL || t->host_header == NULL) return -1;
    snprintf(t->host_header, n, "Host: %.*s", (int)(end - hp), hp);
  }
  return 0;
}

/* The client certificate on x: the kubeconfig's, or the one an exec plugin
** returned last (x->cred_gen says which generation x carries; libcurl
** opens a new connection for a handle whose certificate changed). */
static void set_client_cert(struct cozy_transport *t, struct cozy_exchange *x) {
  struct curl_blob blob;
  x->cred_gen = t->cred_gen;
  if (t->kc.cert.data == NULL || t->kc.key.data == NULL) {
    CHECK_SETOPT(x, CURLOPT_SSLCERT_BLOB, NULL);
    CHECK_SETOPT(x, CURLOPT_SSLKEY_BLOB, NULL);
    CHECK_SETOPT(x, CURLOPT_PROXY_SSLCERT_BLOB, NULL);
    CHECK_SETOPT(x, CURLOPT_PROXY_SSLKEY_BLOB, NULL);
    return;
  }
  /* the API server's connection, then an https proxy's: one that asks for a
  ** client certificate gets the same one, as Go's transport shakes hands
  ** with it using the cluster's tls.Config */
  for (int proxy = 0; proxy <= 1; proxy++) {
    blob.data = t->kc.cert.data;
    blob.len = t->kc.cert.len;
    blob.flags = CURL_BLOB_COPY;
    if (proxy) CHECK_SETOPT(x, CURLOPT_PROXY_SSLCERT_BLOB, &blob);
    else CHECK_SETOPT(x, CURLOPT_SSLCERT_BLOB, &blob);
    blob.data = t->kc.key.data;
    blob.len = t->kc.key.len;
    if (proxy) CHECK_SETOPT(x, CURLOPT_PROXY_SSLKEY_BLOB, &blob);
    else CHECK_SETOPT(x, CURLOPT_SSLKEY_BLOB, &blob);
  }
  CHECK_SETOPT(x, CURLOPT_SSLCERTTYPE, "PEM");
  CHECK_SETOPT(x, CURLOPT_SSLKEYTYPE, "PEM");
  CHECK_SETOPT(x, CURLOPT_PROXY_SSLCERTTYPE, "PEM");
  CHECK_SETOPT(x, CURLOPT_PROXY_SSLKEYTYPE, "PEM");
}

/* Called by libcurl each time it is about to send the request on a
** connection: once per attempt, and again when it re-sends the attempt by
** itself because the kept-alive connection it reused died before any byte of
** the answer came (Curl_retry_request). For a write, that second send is
** refused: the attempt then fails as a reset connection, and the retry rule
** decides, visibly (attempts, rate limit, before_attempt). */
static int on_prereq(void *ud, char *primary_ip, char *local_ip, int primary_port, int local_port) {
  struct cozy_exchange *x = ud;
  (void)primary_ip;
  (void)local_ip;
  (void)primary_port;
  (void)local_port;
  if (++x->sends > 1 && x->refuse_resend) {
    x->resend_refused = 1;
    return CURL_PREREQFUNC_ABORT;
  }
  return CURL_PREREQFUNC_OK;
}

int cozy_exchange_init(struct cozy_transport *t, struct cozy_exchange *x) {
  CURL *c = curl_easy_init();
  struct curl_blob blob;
  memset(x, 0, sizeof *x);
  if (c == NULL) return -1;
  x->curl = c;
  x->setopt_rc = CURLE_OK;
  CHECK_SETOPT(x, CURLOPT_ERRORBUFFER, x->errbuf);
  CHECK_SETOPT(x, CURLOPT_SHARE, t->share);
  CHECK_SETOPT(x, CURLOPT_PRIVATE, x);
  CHECK_SETOPT(x, CURLOPT_NOSIGNAL, 1L);
  CHECK_SETOPT(x, CURLOPT_NOPROGRESS, 1L);
  CHECK_SETOPT(x, CURLOPT_USERAGENT, "cozy-migrate/" COZY_MIGRATE_VERSION);
  CHECK_SETOPT(x, CURLOPT_ACCEPT_ENCODING, ""); /* every encoding curl supports: gzip */
  CHECK_SETOPT(x, CURLOPT_TCP_KEEPALIVE, 1L);
  CHECK_SETOPT(x, CURLOPT_TCP_KEEPIDLE, 30L);
  CHECK_SETOPT(x, CURLOPT_TCP_KEEPINTVL, 15L);
  CHECK_SETOPT(x, CURLOPT_CONNECTTIMEOUT_MS, to_ms(t->connect_timeout));
  CHECK_SETOPT(x, CURLOPT_PROTOCOLS_STR, "https,http");
  CHECK_SETOPT(x, CURLOPT_FOLLOWLOCATION, 0L);
  /* refuses at once a Content-Length above the limit (the body is also
  ** counted as it arrives, in on_body: chunked and compressed bodies) */
  CHECK_SETOPT(x, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)t->max_response_bytes);
  CHECK_SETOPT(x, CURLOPT_WRITEFUNCTION, cozy_http_on_body);
  CHECK_SETOPT(x, CURLOPT_HEADERFUNCTION, cozy_http_on_header);
  CHECK_SETOPT(x, CURLOPT_PREREQFUNCTION, on_prereq);
  CHECK_SETOPT(x, CURLOPT_PREREQDATA, x);
  CHECK_SETOPT(x, CURLOPT_XFERINFOFUNCTION, on_progress);
  CHECK_SETOPT(x, CURLOPT_XFERINFODATA, x);
  if (t->connect_to) CHECK_SETOPT(x, CURLOPT_CONNECT_TO, t->connect_to);
  {
    /* the kubeconfig's proxy-url, else the proxy as kubectl picks it from
    ** the environment, or none: libcurl's own reading of it differs
    ** (core/proxy.c) */
    char *proxy = t->kc.proxy_url ? proxy_url(t->kc.proxy_url) : cozy_proxy_for(t->kc.server);
    CHECK_SETOPT(x, CURLOPT_PROXY, proxy ? proxy : ""); /* libcurl copies it */
    /* the decision is made: libcurl must not apply $NO_PROXY on top of it */
    CHECK_SETOPT(x, CURLOPT_NOPROXY, "");
    x->https_proxy = proxy != NULL && strncasecmp(proxy, "https://", 8) == 0;
    if (proxy) {
      OPENSSL_cleanse(proxy, strlen(proxy)); /* may carry user:password */
      free(proxy);
    }
  }
  /* An https:// proxy is checked as client-go checks it: Go's http.Transport
  ** shakes hands with the proxy using the cluster's own TLS settings
  ** (persistConn.addTLS with TLSClientConfig), so the proxy's certificate
  ** must chain to the cluster's certificate-authority (else the system
  ** roots) and insecure-skip-tls-verify turns both checks off, never one. */
  if (t->kc.insecure) {
    CHECK_SETOPT(x, CURLOPT_SSL_VERIFYPEER, 0L);
    CHECK_SETOPT(x, CURLOPT_SSL_VERIFYHOST, 0L);
    CHECK_SETOPT(x, CURLOPT_PROXY_SSL_VERIFYPEER, 0L);
    CHECK_SETOPT(x, CURLOPT_PROXY_SSL_VERIFYHOST, 0L);
  } else {
    CHECK_SETOPT(x, CURLOPT_SSL_VERIFYPEER, 1L);
    CHECK_SETOPT(x, CURLOPT_SSL_VERIFYHOST, 2L);
    CHECK_SETOPT(x, CURLOPT_PROXY_SSL_VERIFYPEER, 1L);
    CHECK_SETOPT(x, CURLOPT_PROXY_SSL_VERIFYHOST, 2L);
  }
  if (t->kc.ca.data) {
    blob.data = t->kc.ca.data;
    blob.len = t->kc.ca.len;
    blob.flags = CURL_BLOB_COPY;
    CHECK_SETOPT(x, CURLOPT_CAINFO_BLOB, &blob);
    CHECK_SETOPT(x, CURLOPT_PROXY_CAINFO_BLOB, &blob);
  }
  set_client_cert(t, x);
  return x->setopt_rc == CURLE_OK ? 0 : -1;
}

/* The share: one connection pool, TLS session cache and DNS cache for every
** handle of the client. The client is used by one thread at a time, so the
** share needs no lock callbacks. */
int cozy_http_init(struct cozy_transport *t) {
  CURLSHcode sc;
  t->share = curl_share_init();
  if (t->share == NULL) {
    snprintf(t->x.errbuf, sizeof t->x.errbuf, "curl_share_init failed");
    return -1;
  }
  sc = curl_share_setopt(t->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_CONNECT);
  if (sc == CURLSHE_OK) sc = curl_share_setopt(t->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
  if (sc == CURLSHE_OK) sc = curl_share_setopt(t->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
  if (sc != CURLSHE_OK) {
    snprintf(t->x.errbuf, sizeof t->x.errbuf, "curl_share_setopt failed: %s", curl_share_strerror(sc));
    return -1;
  }
  if (route(t) != 0) {
    snprintf(t->x.errbuf, sizeof t->x.errbuf, "out of memory");
    return -1;
  }
  return cozy_exchange_init(t, &t->x);
}

static void free_headers(struct cozy_exchange *t) {
  struct curl_slist *h;
  /* the Authorization line is a secret: wipe every line before freeing */
  for (h = t->headers; h != NULL; h = h->next) OPENSSL_cleanse(h->data, strlen(h->data));
  curl_slist_free_all(t->headers);
  t->headers = NULL;
}

void cozy_exchange_cleanup(struct cozy_exchange *x) {
  free_headers(x);
  if (x->curl) curl_easy_cleanup(x->curl);
  x->curl = NULL;
}

/* Every handle must be gone before the share (curl_share_cleanup refuses a
** share in use): the batches are closed first (cozy_multi_close_all). */
void cozy_http_cleanup(struct cozy_transport *t) {
  cozy_exchange_cleanup(&t->x);
  if (t->share) curl_share_cleanup(t->share);
  t->share = NULL;
  curl_slist_free_all(t->connect_to);
  t->connect_to = NULL;
  free(t->base);
  free(t->host_header);
  t->base = t->host_header = NULL;
  cozy_response_free(&t->resp);
}

static int add_header(struct cozy_exchange *t, const char *line) {
  struct curl_slist *n = curl_slist_append(t->headers, line);
  if (n == NULL) return -1;
  t->headers = n;
  return 0;
}

/* "name: value" as one header line; an empty value as "name;", libcurl's
** way to send it (a "name:" line would remove the header instead). */
static int add_named(struct cozy_exchange *x, const char *name, const char *value) {
  size_t n = strlen(name) + strlen(value) + 3;
  char *line = malloc(n);
  int bad;
  if (line == NULL) return -1;
  if (*value) snprintf(line, n, "%s: %s", name, value);
  else snprintf(line, n, "%s;", name);
  bad = add_header(x, line);
  free(line);
  return bad;
}

/* An as-user-extra key in a header name, as client-go escapes it
** (transport/round_trippers.go, headerKeyEscape): a byte that is not an
** HTTP token character, and '%', as %XX; the API server lowercases and
** unescapes it. */
static void extra_header_name(char *dst, const char *key) {
  static const char token[] = "!#$&'*+-.^_`|~";
  static const char hex[] = "0123456789ABCDEF";
  const unsigned char *k;
  dst += sprintf(dst, "Impersonate-Extra-");
  for (k = (const unsigned char *)key; *k; k++) {
    if ((*k >= 'a' && *k <= 'z') || (*k >= 'A' && *k <= 'Z') || (*k >= '0' && *k <= '9') ||
        strchr(token, *k) != NULL) {
      *dst++ = (char)*k;
    } else {
      *dst++ = '%';
      *dst++ = hex[*k >> 4];
      *dst++ = hex[*k & 15];
    }
  }
  *dst = '\0';
}

/* The kubeconfig user's impersonation, as client-go's impersonating round
** tripper sends it: Impersonate-User, Impersonate-Uid when set, one
** Impersonate-Group per group and one Impersonate-Extra-<key> per value. */
static int add_impersonation(struct cozy_exchange *x, const struct cozy_kubeconfig *kc) {
  char **p;
  if (kc->as_user == NULL) return 0;
  if (add_named(x, "Impersonate-User", kc->as_user) != 0) return -1;
  if (kc->as_uid && add_named(x, "Impersonate-Uid", kc->as_uid) != 0) return -1;
  for (p = kc->as_groups; p && *p; p++)
    if (add_named(x, "Impersonate-Group", *p) != 0) return -1;
  for (p = kc->as_extra; p && p[0] && p[1]; p += 2) {
    char *name = malloc(sizeof "Impersonate-Extra-" + 3 * strlen(p[0]));
    int bad;
    if (name == NULL) return -1;
    extra_header_name(name, p[0]);
    bad = add_named(x, name, p[1]);
    free(name);
    if (bad) return -1;
  }
  return 0;
}

CURLcode cozy_exchange_prepare(struct cozy_transport *t, struct cozy_exchange *x, const char *method,
                               const char *url, const char *body, size_t body_len, const char *content_type,
                               double timeout, int reuse) {
  char line[256];
  x->setopt_rc = CURLE_OK;
  cozy_response_reset(x->resp);
  x->errbuf[0] = '\0';
  x->sends = 0;
  x->resend_refused = 0;
  x->stop = COZY_GO;
  free_headers(x);
  if (x->cred_gen != t->cred_gen) set_client_cert(t, x);
  if (add_header(x, "Accept: application/json") != 0) return CURLE_OUT_OF_MEMORY;
  if (add_header(x, "Expect:") != 0) return CURLE_OUT_OF_MEMORY; /* no 100-continue round trip */
  if (t->host_header && add_header(x, t->host_header) != 0) return CURLE_OUT_OF_MEMORY;
  if (body != NULL && content_type != NULL) {
    snprintf(line, sizeof line, "Content-Type: %s", content_type);
    if (add_header(x, line) != 0) return CURLE_OUT_OF_MEMORY;
  }
  if (t->kc.token.data != NULL && t->kc.token.len > 0) {
    size_t n = t->kc.token.len + sizeof "Authorization: Bearer ";
    char *auth = malloc(n);
    int bad;
    if (auth == NULL) return CURLE_OUT_OF_MEMORY;
    snprintf(auth, n, "Authorization: Bearer %s", t->kc.token.data);
    bad = add_header(x, auth);
    OPENSSL_cleanse(auth, n);
    free(auth);
    if (bad) return CURLE_OUT_OF_MEMORY;
  }
  if (add_impersonation(x, &t->kc) != 0) return CURLE_OUT_OF_MEMORY;
  CHECK_SETOPT(x, CURLOPT_WRITEDATA, x->resp);
  CHECK_SETOPT(x, CURLOPT_HEADERDATA, x->resp);
  CHECK_SETOPT(x, CURLOPT_URL, url);
  CHECK_SETOPT(x, CURLOPT_HTTPHEADER, x->headers);
  CHECK_SETOPT(x, CURLOPT_NOBODY, strcmp(method, "HEAD") == 0 ? 1L : 0L);
  if (body != NULL) {
    CHECK_SETOPT(x, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
    CHECK_SETOPT(x, CURLOPT_POSTFIELDS, body);
    CHECK_SETOPT(x, CURLOPT_CUSTOMREQUEST, method);
  } else if (strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0) {
    CHECK_SETOPT(x, CURLOPT_HTTPGET, 1L);
    CHECK_SETOPT(x, CURLOPT_CUSTOMREQUEST, NULL);
  } else {
    CHECK_SETOPT(x, CURLOPT_HTTPGET, 1L);
    CHECK_SETOPT(x, CURLOPT_CUSTOMREQUEST, method);
  }
  /* Connections (docs/transport.md): a read, or a write whose resend cannot
  ** apply it twice, goes out on a kept-alive connection; any other write on
  ** a connection opened for it, which then joins the pool. libcurl re-sends
  ** an attempt by itself when a reused connection dies before the answer
  ** (on_prereq): harmless for a read, refused for a write. */
  CHECK_SETOPT(x, CURLOPT_FRESH_CONNECT, reuse ? 0L : 1L);
  x->refuse_resend = strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0;
  CHECK_SETOPT(x, CURLOPT_TIMEOUT_MS, to_ms(timeout));
  /* Stall detection: under 1 byte/s for 30 s (or the whole timeout, if shorter)
  ** means a dead peer, even with no overall timeout set. */
  CHECK_SETOPT(x, CURLOPT_LOW_SPEED_LIMIT, 1L);
  CHECK_SETOPT(x, CURLOPT_LOW_SPEED_TIME,
               (long)(timeout > 0 && timeout < 30 ? (timeout < 1 ? 1 : timeout) : 30));
  CHECK_SETOPT(x, CURLOPT_NOPROGRESS, 0L);
  return x->setopt_rc; /* when not OK, x->errbuf names the option */
}

static int is_tls_failure(CURLcode rc) {
  return rc == CURLE_PEER_FAILED_VERIFICATION || rc == CURLE_SSL_CONNECT_ERROR || rc == CURLE_SSL_CERTPROBLEM;
}

/* A TLS failure through an https proxy, made to say which hop failed, as
** libcurl's message reads the same for either: before the proxy answered any
** CONNECT it is the proxy's own handshake (the server's comes only inside the
** tunnel). Inside the tunnel, libcurl 7.88 reports a server certificate it
** refused as a bare SSL_ERROR_SYSCALL (CURLE_SSL_CONNECT_ERROR, transient):
** the verify result tells a refused certificate apart, which is final, as it
** is without a proxy. */
static CURLcode proxy_tls_failure(struct cozy_exchange *x, CURLcode rc) {
  long connect_code = 0, verify = 0;
  char msg[sizeof x->errbuf];
  if (curl_easy_getinfo(x->curl, CURLINFO_HTTP_CONNECTCODE, &connect_code) != CURLE_OK) return rc;
  if (connect_code == 0) {
    snprintf(msg, sizeof msg, "the https proxy: %.*s", (int)(sizeof msg - sizeof "the https proxy: "),
             x->errbuf[0] ? x->errbuf : curl_easy_strerror(rc));
    memcpy(x->errbuf, msg, sizeof msg);
    return rc;
  }
  if (rc == CURLE_SSL_CONNECT_ERROR &&
      curl_easy_getinfo(x->curl, CURLINFO_SSL_VERIFYRESULT, &verify) == CURLE_OK && verify != X509_V_OK) {
    snprintf(x->errbuf, sizeof x->errbuf, "SSL certificate problem: %s",
             X509_verify_cert_error_string(verify));
    return CURLE_PEER_FAILED_VERIFICATION;
  }
  return rc;
}

CURLcode cozy_exchange_finish(struct cozy_exchange *x, CURLcode rc, long *status) {
  struct cozy_response *r = x->resp;
  *status = 0;
  /* ended by the write callback at a watch's first line: an answer, whose
  ** connection libcurl closes */
  if (rc == CURLE_WRITE_ERROR && r->ended_at_line && !r->body_too_large) rc = CURLE_OK;
  if (rc == CURLE_OK && curl_easy_getinfo(x->curl, CURLINFO_RESPONSE_CODE, status) != CURLE_OK) *status = 0;
  /* the token must not stay in a header list longer than the request: the
  ** handle forgets the list before it is freed */
  x->setopt_rc = CURLE_OK;
  CHECK_SETOPT(x, CURLOPT_HTTPHEADER, NULL);
  free_headers(x);
  if (rc == CURLE_OK && x->setopt_rc != CURLE_OK) rc = x->setopt_rc;
  if (rc == CURLE_ABORTED_BY_CALLBACK && x->resend_refused) {
    rc = CURLE_RECV_ERROR; /* a reset connection, whose request may have landed */
    snprintf(x->errbuf, sizeof x->errbuf,
             "the reused connection closed before any answer came (libcurl's own re-send of "
             "the write was refused)");
  }
  if (x->https_proxy && is_tls_failure(rc)) rc = proxy_tls_failure(x, rc);
  if (r->body_too_large || rc == CURLE_FILESIZE_EXCEEDED) {
    rc = CURLE_FILESIZE_EXCEEDED;
    snprintf(x->errbuf, sizeof x->errbuf,
             "the response body is larger than max_response_bytes (%zu bytes, counted after "
             "decompression); the transfer was stopped",
             r->max_response_bytes);
    r->body_len = 0; /* nothing of a refused body is handed on */
  }
  return rc;
}

CURLcode cozy_http_perform(struct cozy_transport *t, const char *method, const char *url, const char *body,
                           size_t body_len, const char *content_type, double timeout, int reuse,
                           long *status) {
  struct cozy_exchange *x = &t->x;
  CURLcode rc;
  x->resp = &t->resp;
  x->watch = t->watch;
  rc = cozy_exchange_prepare(t, x, method, url, body, body_len, content_type, timeout, reuse);
  if (rc == CURLE_OK) rc = curl_easy_perform(x->curl);
  return cozy_exchange_finish(x, rc, status);
}
