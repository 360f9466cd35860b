/* The HTTP transport of one client: libcurl handles sharing one connection
** pool, its configuration, a token bucket and the bearer token. One per
** client, used by one thread at a time; nothing here is process-wide except
** curl_global_init. */
#ifndef COZY_TRANSPORT_H
#define COZY_TRANSPORT_H

#include <curl/curl.h>

#include "lua.h"

#include "clock.h"
#include "exec_credential.h"
#include "kubeconfig.h"
#include "watch.h"

/* A response body larger than this is refused (ResponseTooLarge) while it
** is read. The largest legitimate answer is a list page: etcd caps an object
** at 1.5 MiB (--max-request-bytes), and a 500-item page of objects averaging
** half a MiB (VMs with big cloud-init data) is 256 MiB. The process holds
** about three copies (curl's buffer, the Lua string, the decoded tables), so
** this also bounds the memory a hostile server can make us take. */
#define COZY_MAX_RESPONSE_BYTES_DEFAULT (256.0 * 1024 * 1024)

/* How long a refused connection is retried by default (docs/transport.md,
** "Retries"): a server that refuses is down or not there, and client-go
** does not retry it at all; a few seconds ride out a restart of the
** endpoint in front of it without making an unreachable cluster wait for
** the whole budget of 5xx and 429, which a live server answered. */
#define COZY_REFUSED_TIME_DEFAULT 5.0

/* retry_policy.c: the engine's named retry policies and its one backoff
** formula, shared by the transport's retries (transport_retry.c) and Lua's
** (transport.backoff: the update engine, the lock's wait). */

/* How the waits between tries grow: before retry n (n >= 1),
** min(base_delay * factor^(n-1), max_delay) * (1 - jitter/2 + jitter*u)
** for a draw u in [0, 1). */
struct cozy_backoff {
  double base_delay; /* the first wait, before jitter */
  double factor; /* growth per retry (>= 1) */
  double max_delay; /* cap of one wait before jitter; a transport also cuts a jittered wait and an honoured
                       Retry-After to it */
  double jitter; /* the spread: 1 is [0.5, 1.5) of the wait, 0 none */
};
double cozy_backoff_delay(const struct cozy_backoff *b, int n, double u);

struct cozy_retry_policy {
  const char *name; /* the named policy it is (or was overridden from) */
  int max_attempts; /* including the first */
  double max_time; /* seconds from the first attempt; no retry starts after it */
  struct cozy_backoff backoff; /* the wait without Retry-After */
  double refused_time; /* seconds from the first attempt within which a refused connection is retried */
};
/* The policy of that name, NULL if none. */
const struct cozy_retry_policy *cozy_retry_policy_find(const char *name);
/* Reads the policy at idx: a name, or a table (its `name`'s policy, "request"
** without one, overridden by its other fields); raises a clear error for an
** unknown name, an unknown field or a bad value. */
void cozy_retry_policy_read(lua_State *L, int idx, struct cozy_retry_policy *p);
void cozy_retry_policy_push(lua_State *L, const struct cozy_retry_policy *p);
int cozy_lua_retry_policy(lua_State *L); /* transport.retry_policy(name [, overrides]) */
int cozy_lua_backoff(lua_State *L); /* transport.backoff(policy, n [, u]) */

/* One answer as it arrives: body, Retry-After and Warning headers. */
struct cozy_response {
  char *body;
  size_t body_len, body_cap;
  size_t max_response_bytes; /* of the body as delivered, i.e. decompressed */
  int body_too_large; /* the write callback stopped the transfer */
  /* a watch's first line (t:request's `first_line`): the transfer ends once
  ** the body holds a line break, the answer so far being the body */
  int end_at_line, ended_at_line;
  double retry_after; /* Retry-After seconds, or -1 */
  char warnings[2048]; /* Warning header values of the answer, '\n'-separated */
  size_t warnings_len;
};

/* One transfer slot: a libcurl easy handle carrying the client's fixed
** options (TLS, timeouts, callbacks) and the state of the attempt it runs.
** t:request has one; a batch (t:multi) one per request in flight. All of a
** client's handles share its connection pool (transport->share). */
struct cozy_exchange {
  CURL *curl;
  char errbuf[CURL_ERROR_SIZE];
  CURLcode setopt_rc; /* first curl_easy_setopt failure of a batch */
  struct curl_slist *headers;
  struct cozy_response *resp; /* where the answer goes */
  /* during an attempt: the calling state's watches (NULL: none), and why the
  ** progress callback aborted the transfer (COZY_GO: it did not) */
  const struct cozy_watches *watch;
  int stop;
  double stop_detail;
  /* libcurl's own re-send (docs/transport.md, "Connections"): how often it
  ** was about to send this attempt, and whether a second send is refused */
  int sends;
  int refuse_resend;
  int resend_refused;
  void *owner; /* the batch job it runs (transport_multi.c) */
  unsigned cred_gen; /* the client certificate it carries (cozy_transport.cred_gen) */
  int https_proxy; /* it goes through an https:// proxy: a TLS failure may be the proxy's */
};

struct cozy_multi;

struct cozy_transport {
  CURLSH *share; /* connections, TLS sessions and DNS of every handle */
  struct cozy_exchange x; /* t:request's handle */
  struct cozy_response resp;
  struct cozy_kubeconfig kc;
  /* where requests go: kc.server, or with tls-server-name that name in its
  ** place (libcurl checks the certificate against, and sends as SNI, the
  ** URL's host), connect_to routing it to the server's real address and
  ** host_header naming the server as written, as client-go sends it */
  char *base;
  struct curl_slist *connect_to;
  char *host_header;
  double request_timeout; /* seconds; 0 = none */
  double connect_timeout;
  double token_refresh; /* re-read token_file at least this often (seconds) */
  double token_read_at; /* monotonic time of the last read (or exec plugin run) */
  unsigned cred_gen; /* bumped when an exec plugin returns a new credential */
  char cred_error[512]; /* why the last exec plugin run failed ("" if it did not) */
  struct cozy_retry_policy retry;
  size_t max_response_bytes; /* of a body as delivered, i.e. decompressed */
  /* token bucket */
  double qps, burst, tokens, refilled_at;
  unsigned int seed; /* for jitter, per client */
  const struct cozy_watches *watch; /* during a request or a batch wait */
  struct cozy_multi *multis; /* open batches, closed with the client */
  int closed;
};

/* transport_http.c */
int cozy_http_init(struct cozy_transport *t);
void cozy_http_cleanup(struct cozy_transport *t);
/* A handle with the client's fixed options, in its connection pool. */
int cozy_exchange_init(struct cozy_transport *t, struct cozy_exchange *x);
void cozy_exchange_cleanup(struct cozy_exchange *x);
/* Sets up one attempt on x (headers, token, method, body, timeout). `reuse`
** says a kept-alive connection may carry it: a read or a write that is safe
** to resend; otherwise it goes out on a connection opened for it. */
CURLcode cozy_exchange_prepare(struct cozy_transport *t, struct cozy_exchange *x, const char *method,
                               const char *url, const char *body, size_t body_len, const char *content_type,
                               double timeout, int reuse);
/* After the transfer ended with rc: the status (0 if none), the header list
** wiped, rc adjusted (ResponseTooLarge, a refused re-send). */
CURLcode cozy_exchange_finish(struct cozy_exchange *x, CURLcode rc, long *status);
/* One attempt of t:request. Returns the CURLcode; *status is the HTTP status (0 if none). */
CURLcode cozy_http_perform(struct cozy_transport *t, const char *method, const char *url, const char *body,
                           size_t body_len, const char *content_type, double timeout, int reuse,
                           long *status);
/* libcurl's write and header callbacks (ud is a struct cozy_response): they
** parse what the server sends, so fuzz/http_response.c drives them directly. */
size_t cozy_http_on_body(char *ptr, size_t size, size_t nmemb, void *ud);
size_t cozy_http_on_header(char *buf, size_t size, size_t nitems, void *ud);
void cozy_response_reset(struct cozy_response *r);
void cozy_response_free(struct cozy_response *r);
/* Re-reads the token file, or runs the exec plugin again; 0 ok (or
** neither), -1 on failure (old credential kept; a plugin's message in
** t->cred_error). */
int cozy_http_reload_token(struct cozy_transport *t);
/* Takes a token from the bucket and returns 0, or returns how many seconds
** until one is there (nothing taken). */
double cozy_ratelimit_take(struct cozy_transport *t, double now);
/* COZY_GO, or why the wait was cut short (t->watch said stop) */
int cozy_ratelimit_wait(struct cozy_transport *t, double *detail);

/* One request as its caller described it to t:request or m:submit, its
** options read and checked by cozy_request_read (transport.c), the one
** option parser of both. The strings point into Lua values that stay on the
** caller's stack at the COZY_REQ_* slots; a batch copies what it keeps. */
struct cozy_request {
  const char *method, *path, *query, *ctype, *body;
  size_t method_len, path_len, query_len, ctype_len, body_len;
  double timeout; /* of one attempt, seconds; 0 = none */
  /* this request's retry bounds: the client's (t->retry), or lower when the
  ** caller asks (a migration's retry budget), never higher */
  int max_attempts;
  double max_time;
  int retry_safe; /* the caller says a write may be sent again */
  int read; /* GET or HEAD: always safe to send again */
  int first_line; /* end the transfer at the body's first line break (a watch's event) */
};

/* The stack slots cozy_request_read fills above (self, method, path, opts):
** the strings, the callbacks and the decode option (nil when absent). */
enum {
  COZY_REQ_QUERY = 5,
  COZY_REQ_CTYPE,
  COZY_REQ_BODY,
  COZY_REQ_BEFORE,
  COZY_REQ_ON_RETRY,
  COZY_REQ_DECODE
};
void cozy_request_read(lua_State *L, const struct cozy_transport *t, struct cozy_request *rq);

/* transport_retry.c: the retry rule (docs/transport.md, "Retries"), the one
** engine of t:request and batches: they differ only in how they wait. */

/* A request's progress across its attempts. */
struct cozy_attempts {
  int n; /* attempts made */
  int did_401; /* the one token-refresh replay is spent */
  double start; /* monotonic time the first attempt was asked for */
  double deadline; /* by when the attempt in flight ends (0: unbounded) */
  /* set by cozy_after_attempt */
  int stop; /* COZY_AFTER_STOP: why the watch ended it, and its detail */
  double stop_detail;
  double delay; /* COZY_AFTER_RETRY: seconds to wait first */
};

enum cozy_after {
  COZY_AFTER_DONE, /* an answer (or a failure) to hand over */
  COZY_AFTER_STOP, /* the caller's watch ended it: never retried */
  COZY_AFTER_REFRESH, /* a 401 with a credential that can be read again: the driver reads it
                         (cozy_refresh_after_401), which says DONE or REPLAY */
  COZY_AFTER_REPLAY, /* send again now */
  COZY_AFTER_RETRY /* transient: send again after a->delay */
};

/* Judges attempt a->n + 1, which ended with rc and status on x: counts it,
** pushes its attempts entry and returns what comes next. */
enum cozy_after cozy_after_attempt(lua_State *L, struct cozy_transport *t, const struct cozy_request *rq,
                                   struct cozy_attempts *a, const struct cozy_exchange *x, CURLcode rc,
                                   long status);
/* The drivers' side of credentials (transport_http.c; t:request's loop in transport.c and
** the batch driver in transport_multi.c call these; the retry judge never
** reads a credential). */
/* Before an attempt goes: re-reads a token file that is due or runs an exec
** plugin whose credential expired, and returns the libcurl timeout of the
** attempt from what is left until a->deadline. */
double cozy_attempt_begin(struct cozy_transport *t, const struct cozy_attempts *a);
/* The judge said COZY_AFTER_REFRESH (its attempts entry on top of L): reads
** the credential again and returns COZY_AFTER_REPLAY, or COZY_AFTER_DONE when
** an exec plugin failed (the 401 stands; the entry gets the plugin's reason
** as credential_error). */
enum cozy_after cozy_refresh_after_401(lua_State *L, struct cozy_transport *t);
/* before_attempt, asked before every attempt: the caller pushes the
** function and cozy_push_before_info's table, calls it its own way, and
** reads the one result with cozy_before_answer (which pops it). That returns
** COZY_BEFORE_GO, COZY_BEFORE_WAIT (*wait seconds, then ask again), a
** COZY_STOP_* the watch said (*detail), or COZY_BEFORE_ERROR with the
** message in err (not pushed: a batch frees its job before it raises). */
enum { COZY_BEFORE_GO = COZY_GO, COZY_BEFORE_WAIT = -1, COZY_BEFORE_ERROR = -2 };
/* { attempt=, deadline=, method=, path= [, id= (id > 0: a batch's)] } */
void cozy_push_before_info(lua_State *L, const struct cozy_request *rq, const struct cozy_attempts *a,
                           lua_Integer id);
int cozy_before_answer(lua_State *L, struct cozy_transport *t, const struct cozy_request *rq,
                       const struct cozy_attempts *a, double *wait, double *detail, char *err, size_t errlen);
void cozy_push_stop(lua_State *L, int stop, double detail, int sent, double elapsed);
double cozy_attempt_deadline(const struct cozy_transport *t, double now, double timeout);
/* An answer's body for Lua, as text or decoded (transport.c) */
int cozy_decode_option(lua_State *L, int idx);
void cozy_push_results(lua_State *L, const struct cozy_response *r, int failed, long status, int decode_idx,
                       int attempts_idx);
/* The checks on what goes into a request line or a header (transport.c) */
int cozy_bad_http_text(const char *s, size_t len, int no_space);

/* transport_multi.c */
int cozy_transport_multi(lua_State *L); /* t:multi{ concurrency = N } */
void cozy_multi_open(lua_State *L); /* the batch metatable */
void cozy_multi_close_all(struct cozy_transport *t);
int cozy_multi_busy(const struct cozy_transport *t); /* a batch is in a callback */

#endif
