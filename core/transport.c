/*
** cozy.transport: a Kubernetes API client connection for Lua.
**
**   local t, err = transport.new{ kubeconfig=, context=, request_timeout=30,
**       connect_timeout=10, qps=1000, burst=2000, token_refresh=60,
**       max_response_bytes=256 MiB, exec_timeout=60,
**       retry = "request" } (a named retry policy, or a table: its `name`'s
**       values, "request"'s without one, overridden by its fields; see
**       core/retry_policy.c and transport.retry_policy)
**   -- err (config problems) = { file=, field=, message= }
**   t:info()   --> { server=, namespace=, source=, context=, cluster=, user=,
**                    insecure=, auth=, token_file=, max_attempts=, max_time=,
**                    retry_policy= (its name), ... }
**                    (no secret in it)
**   t:request(method, path, { query=, body=, content_type=, retry_safe=,
**                              timeout=, max_attempts=, max_time=,
**                              on_retry=function(attempt) end,
**                              before_attempt=function(info) end,
**                              decode=true or a projection,
**                              first_line=true })
**     --> status (0: transport failure), body (string or nil), attempts,
**         warnings (the answer's Warning headers, '\n'-separated, or nil),
**         decode_error
**   With `decode`, a 2xx body comes back decoded (json.decode with that
**   projection, read straight from the transfer's buffer: a list page is
**   never copied into a Lua string), nil when empty; when it is not JSON,
**   body is the text and decode_error the decoder's message. With
**   `first_line`, the transfer ends (its connection closed) once the body
**   holds a line break: a watch's stream answers at its first event.
**   before_attempt({ attempt=n, deadline=, method=, path= }) runs before
**   every attempt: nil/true sends it, a number waits that many seconds and
**   asks again, an error ends the request with that error.
**   t:multi{ concurrency = N } --> a batch of parallel requests under the
**     same rules (core/transport_multi.c)
**   t:close()  (also __gc and __close; closes the client's batches too)
**   transport.config{ kubeconfig=, context= } --> { namespace=, source=,
**     context=, server= }: the configuration found, nothing connected
**   transport.retry_policy(name [, overrides]), transport.backoff(policy,
**     n [, u]): the named retry policies and the one backoff formula
**     (core/retry_policy.c)
**   transport.write_kubeconfig{ kubeconfig=, context=, namespace= } -->
**     path, dir, source: that configuration as a kubeconfig of one context, for a
**     legacy script (core/kubeconfig_write.c); with endpoint = a cozy.endpoint
**     and port =, a rehearsal's: that endpoint's server, CA and token only
**
** Runtime failures are returned, never raised: cozy.kube turns them into
** structured errors. Retries happen here (see docs/transport.md for the
** rule): 429 and connection failures (nothing sent) always, 500/502/503/504
** and other transport errors only when the request is a read or the caller
** marked it retry-safe; one immediate retry
** after a 401 when the token comes from a file that can be re-read or from
** an exec plugin (run again then, and once its credential expires). Under an
** armed proc.watch (core/watch.c) a signal or the watch's deadline ends the
** request (reason Interrupted / DeadlineExceeded), in flight or waiting,
** and it is never retried.
** Secrets (token, client key) never leave C memory.
*/
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lua.h"
#include "lauxlib.h"

#include "endpoint.h"
#include "host.h"
#include "json.h"
#include "kubeconfig_write.h"
#include "transport.h"

#define TRANSPORT_MT "cozy.transport"

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_rc;

static void global_init(void) {
  global_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

static struct cozy_transport *check_transport(lua_State *L) {
  struct cozy_transport *t = luaL_checkudata(L, 1, TRANSPORT_MT);
  if (t->closed) luaL_argerror(L, 1, "transport is closed");
  return t;
}

static double opt_number(lua_State *L, int idx, const char *key, double dflt, double min) {
  double v;
  lua_getfield(L, idx, key);
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    return dflt;
  }
  if (!lua_isnumber(L, -1)) luaL_error(L, "option '%s' must be a number", key);
  v = lua_tonumber(L, -1);
  lua_pop(L, 1);
  if (v < min) luaL_error(L, "option '%s' must be >= %f", key, min);
  return v;
}

/* Pushes option `key` (nil or a string) and returns the string or NULL. The
** value stays on the stack for as long as the pointer is used: the options
** table is no guarantee (an __index may return a fresh string, an on_retry
** callback may change the table, and the collector frees what nothing
** holds). */
static const char *opt_string(lua_State *L, int idx, const char *key, size_t *len) {
  lua_getfield(L, idx, key);
  if (lua_isnil(L, -1)) return NULL;
  if (lua_type(L, -1) != LUA_TSTRING) luaL_error(L, "option '%s' must be a string", key);
  return lua_tolstring(L, -1, len);
}

/* Pushes option `key`: nil or a function. */
static void opt_function(lua_State *L, int idx, const char *key) {
  lua_getfield(L, idx, key);
  if (!lua_isnil(L, -1) && !lua_isfunction(L, -1)) luaL_error(L, "option '%s' must be a function", key);
}

/* 1 if s (len bytes) has a byte that may not appear in an HTTP request line
** or header value: a control character (CR and LF would end the line and
** start a header of the caller's choosing; NUL would cut it) or, when
** no_space is set (method, path and query), a space. */
int cozy_bad_http_text(const char *s, size_t len, int no_space) {
  size_t i;
  for (i = 0; i < len; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c < 0x20 || c == 0x7f || (no_space && c == ' ')) return 1;
  }
  return 0;
}

/* The `decode` option at idx: 0 when absent, else idx (true or a projection). */
int cozy_decode_option(lua_State *L, int idx) {
  int t = lua_type(L, idx);
  if (t == LUA_TNIL) return 0;
  if (t == LUA_TTABLE || (t == LUA_TBOOLEAN && lua_toboolean(L, idx))) return idx;
  return luaL_error(L, "option 'decode' must be true or a projection table");
}

/* t:request(method, path, opts) and m:submit(method, path, opts): the
** arguments checked and the options read, all of them before the caller
** allocates anything (an __index may raise). Leaves the COZY_REQ_* slots
** on the stack. */
void cozy_request_read(lua_State *L, const struct cozy_transport *t, struct cozy_request *rq) {
  double budget;
  rq->method = luaL_checklstring(L, 2, &rq->method_len);
  rq->path = luaL_checklstring(L, 3, &rq->path_len);
  luaL_argcheck(L, rq->path[0] == '/', 3, "path must start with '/'");
  luaL_argcheck(L, rq->method_len > 0 && strspn(rq->method, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") == rq->method_len,
                2, "method must be an HTTP method in capitals");
  luaL_argcheck(L, !cozy_bad_http_text(rq->path, rq->path_len, 1), 3,
                "path contains a space or a control character (CR, LF, NUL...)");
  if (lua_isnoneornil(L, 4)) {
    lua_settop(L, 3);
    lua_newtable(L);
  }
  luaL_checktype(L, 4, LUA_TTABLE);
  lua_settop(L, 4);
  rq->query_len = rq->ctype_len = rq->body_len = 0;
  rq->query = opt_string(L, 4, "query", &rq->query_len); /* COZY_REQ_QUERY */
  if (rq->query && cozy_bad_http_text(rq->query, rq->query_len, 1))
    luaL_argerror(L, 4, "query contains a space or a control character (CR, LF, NUL...)");
  rq->ctype = opt_string(L, 4, "content_type", &rq->ctype_len); /* COZY_REQ_CTYPE */
  if (rq->ctype && cozy_bad_http_text(rq->ctype, rq->ctype_len, 0))
    luaL_argerror(L, 4,
                  "content_type contains a control character (CR, LF, NUL...): "
                  "it would split the Content-Type header");
  if (rq->ctype && rq->ctype_len > 200) luaL_argerror(L, 4, "content_type is longer than 200 bytes");
  rq->body = opt_string(L, 4, "body", &rq->body_len); /* COZY_REQ_BODY */
  opt_function(L, 4, "before_attempt"); /* COZY_REQ_BEFORE */
  opt_function(L, 4, "on_retry"); /* COZY_REQ_ON_RETRY */
  lua_getfield(L, 4, "decode"); /* COZY_REQ_DECODE */
  cozy_decode_option(L, COZY_REQ_DECODE);
  rq->timeout = opt_number(L, 4, "timeout", t->request_timeout, 0);
  /* a budget lowers the client's bounds, never raises them; the backoff and
  ** Retry-After between attempts are the client's alone */
  budget = opt_number(L, 4, "max_attempts", t->retry.max_attempts, 1);
  rq->max_attempts = budget < t->retry.max_attempts ? (int)budget : t->retry.max_attempts;
  budget = opt_number(L, 4, "max_time", t->retry.max_time, 0);
  rq->max_time = budget < t->retry.max_time ? budget : t->retry.max_time;
  lua_getfield(L, 4, "retry_safe");
  rq->retry_safe = lua_toboolean(L, -1);
  lua_pop(L, 1);
  lua_getfield(L, 4, "first_line");
  rq->first_line = lua_toboolean(L, -1);
  lua_pop(L, 1);
  rq->read = strcmp(rq->method, "GET") == 0 || strcmp(rq->method, "HEAD") == 0;
}

/* Pushes an answer's body and what decoding it said: the text and nil; or,
** asked to decode (decode_idx != 0) a 2xx answer, the value (nil for an
** empty body) and nil, or the text and the decoder's message when it is not
** JSON. */
static void push_body(lua_State *L, const struct cozy_response *r, long status, int decode_idx) {
  const char *body = r->body ? r->body : "";
  if (decode_idx == 0 || status < 200 || status > 299) {
    lua_pushlstring(L, body, r->body_len);
    lua_pushnil(L);
  } else if (r->body_len == 0) {
    lua_pushnil(L);
    lua_pushnil(L);
  } else {
    cozy_json_push_buffer_decoder(L);
    lua_pushlightuserdata(L, r->body);
    lua_pushinteger(L, (lua_Integer)r->body_len);
    lua_pushvalue(L, decode_idx);
    if (lua_pcall(L, 3, 1, 0) == LUA_OK) {
      lua_pushnil(L);
    } else {
      lua_pushlstring(L, body, r->body_len);
      lua_insert(L, -2);
    }
  }
}

/* Pushes what t:request (and m:wait, after the id) returns for a request
** that has ended: status (0 when it failed or was stopped), body, attempts
** (the table at attempts_idx), warnings, decode_error. */
void cozy_push_results(lua_State *L, const struct cozy_response *r, int failed, long status, int decode_idx,
                       int attempts_idx) {
  if (failed) {
    lua_pushinteger(L, 0);
    lua_pushnil(L);
    lua_pushnil(L);
  } else {
    lua_pushinteger(L, status);
    push_body(L, r, status, decode_idx);
  }
  lua_pushvalue(L, attempts_idx);
  if (!failed && r->warnings_len > 0)
    lua_pushlstring(L, r->warnings, r->warnings_len - 1); /* without the last '\n' */
  else lua_pushnil(L);
  lua_rotate(L, -3, -1); /* status, body, attempts, warnings, decode_error */
}

/* nil and { file =, field =, message = }: a configuration error as
** cozy.kube turns it into kind "config". Returns 2, for a return. */
static int push_config_error(lua_State *L, const struct cozy_config_error *err) {
  lua_pushnil(L);
  lua_createtable(L, 0, 3);
  lua_pushstring(L, err->file);
  lua_setfield(L, -2, "file");
  lua_pushstring(L, err->field);
  lua_setfield(L, -2, "field");
  lua_pushstring(L, err->message);
  lua_setfield(L, -2, "message");
  return 2;
}

static int t_gc(lua_State *L) {
  struct cozy_transport *t = luaL_checkudata(L, 1, TRANSPORT_MT);
  if (!t->closed) {
    cozy_multi_close_all(t); /* their handles are in t's share */
    cozy_http_cleanup(t);
    cozy_kubeconfig_free(&t->kc);
    t->closed = 1;
  }
  return 0;
}

static int t_new(lua_State *L) {
  struct cozy_transport *t;
  struct cozy_config_error err;
  const char *path, *context;
  luaL_checktype(L, 1, LUA_TTABLE);
  pthread_once(&global_once, global_init);
  if (global_rc != CURLE_OK)
    return luaL_error(L, "curl_global_init failed: %s", curl_easy_strerror(global_rc));
  lua_settop(L, 1);
  path = opt_string(L, 1, "kubeconfig", NULL); /* index 2 */
  context = opt_string(L, 1, "context", NULL); /* index 3 */
  t = lua_newuserdatauv(L, sizeof *t, 0);
  memset(t, 0, sizeof *t);
  t->closed = 1; /* until fully set up, __gc has nothing to free */
  luaL_setmetatable(L, TRANSPORT_MT);
  t->request_timeout = opt_number(L, 1, "request_timeout", 30, 0);
  t->connect_timeout = opt_number(L, 1, "connect_timeout", 10, 0.001);
  t->qps = opt_number(L, 1, "qps", 1000, 0);
  t->burst = opt_number(L, 1, "burst", 2000, 1);
  t->token_refresh = opt_number(L, 1, "token_refresh", 60, 0);
  {
    double max = opt_number(L, 1, "max_response_bytes", COZY_MAX_RESPONSE_BYTES_DEFAULT, 1);
    if (max > 1e15) return luaL_error(L, "option 'max_response_bytes' must be <= 1e15");
    t->max_response_bytes = (size_t)max;
  }
  /* a named policy (retry_policy.c), "request" unless the caller names another */
  lua_getfield(L, 1, "retry");
  if (lua_isnil(L, -1)) t->retry = *cozy_retry_policy_find("request");
  else if (lua_type(L, -1) == LUA_TSTRING || lua_istable(L, -1)) cozy_retry_policy_read(L, -1, &t->retry);
  else return luaL_error(L, "option 'retry' must be a retry policy's name or a table");
  lua_pop(L, 1);
  {
    double exec_timeout = opt_number(L, 1, "exec_timeout", COZY_EXEC_TIMEOUT_DEFAULT, 0.001);
    int rc = cozy_kubeconfig_load(path, context, &t->kc, &err);
    if (rc == 0 && t->kc.exec != NULL) {
      /* the plugin runs now: a credential it cannot give is a configuration
      ** error, reported as one, before any request */
      t->kc.exec->timeout = exec_timeout;
      if (cozy_exec_run(t->kc.exec, &t->kc, 0, cozy_watches(L), err.message, sizeof err.message) != 0) {
        snprintf(err.file, sizeof err.file, "%s", t->kc.exec->file);
        snprintf(err.field, sizeof err.field, "%s", t->kc.exec->field);
        cozy_kubeconfig_free(&t->kc);
        rc = -1;
      }
    }
    if (rc != 0) return push_config_error(L, &err);
  }
  t->closed = 0;
  t->resp.max_response_bytes = t->max_response_bytes;
  t->resp.retry_after = -1;
  t->tokens = t->burst;
  t->refilled_at = t->token_read_at = cozy_monotime();
  t->seed = (unsigned int)((size_t)t ^ (size_t)(t->refilled_at * 1e6));
  if (cozy_http_init(t) != 0)
    return luaL_error(L, "cannot set up the HTTP client: %s",
                      t->x.errbuf[0] ? t->x.errbuf : "curl_easy_init failed");
  return 1;
}

static void set_str(lua_State *L, const char *k, const char *v) {
  if (v == NULL) return;
  lua_pushstring(L, v);
  lua_setfield(L, -2, k);
}

static void set_num(lua_State *L, const char *k, double v) {
  lua_pushnumber(L, v);
  lua_setfield(L, -2, k);
}

static int t_info(lua_State *L) {
  struct cozy_transport *t = check_transport(L);
  lua_newtable(L);
  set_str(L, "server", t->kc.server);
  set_str(L, "namespace", t->kc.namespace);
  set_str(L, "source", t->kc.source);
  set_str(L, "context", t->kc.context);
  set_str(L, "cluster", t->kc.cluster);
  set_str(L, "user", t->kc.user);
  set_str(L, "token_file", t->kc.token_file);
  set_str(L, "impersonate", t->kc.as_user); /* the kubeconfig's `as`: whom every request acts as */
  lua_pushboolean(L, t->kc.insecure);
  lua_setfield(L, -2, "insecure");
  set_str(L, "auth",
          t->kc.exec             ? "exec"
              : t->kc.cert.data  ? "client-certificate"
              : t->kc.token_file ? "token-file"
              : t->kc.token.data ? "token"
                                 : "none");
  set_str(L, "ca", t->kc.ca.data ? "configured" : t->kc.insecure ? "none" : "system");
  set_num(L, "request_timeout", t->request_timeout);
  set_num(L, "qps", t->qps);
  set_num(L, "burst", t->burst);
  /* the retry bounds a request's own (max_attempts, max_time) may only lower */
  lua_pushinteger(L, t->retry.max_attempts);
  lua_setfield(L, -2, "max_attempts");
  set_num(L, "max_time", t->retry.max_time);
  set_str(L, "retry_policy", t->retry.name);
  lua_pushinteger(L, (lua_Integer)t->max_response_bytes);
  lua_setfield(L, -2, "max_response_bytes");
  return 1;
}

static int t_close(lua_State *L) {
  struct cozy_transport *t = luaL_checkudata(L, 1, TRANSPORT_MT);
  if (!t->closed && cozy_multi_busy(t))
    return luaL_error(L, "transport closed by a callback of one of its batches");
  return t_gc(L);
}

/* Asks before_attempt (COZY_REQ_BEFORE) whether the attempt may go, and
** waits (interruptibly) for as long as it says. Returns COZY_GO with
** a->deadline set for the attempt, or why the watch stopped the wait. */
static int ask_before_attempt(lua_State *L, struct cozy_transport *t, const struct cozy_request *rq,
                              struct cozy_attempts *a, double *detail) {
  char err[160];
  for (;;) {
    double wait = 0;
    int r;
    a->deadline = cozy_attempt_deadline(t, cozy_monotime(), rq->timeout);
    if (lua_isnil(L, COZY_REQ_BEFORE)) return COZY_GO;
    lua_pushvalue(L, COZY_REQ_BEFORE);
    cozy_push_before_info(L, rq, a, 0);
    lua_call(L, 1, 1);
    if (t->closed) return luaL_error(L, "transport closed by before_attempt");
    r = cozy_before_answer(L, t, rq, a, &wait, detail, err, sizeof err);
    if (r == COZY_BEFORE_ERROR) return luaL_error(L, "%s", err);
    if (r != COZY_BEFORE_WAIT) return r;
    r = cozy_watch_sleep(t->watch, wait, detail);
    if (r != COZY_GO) return r;
  }
}

/* The server, the path and the query: pushed, and returned. */
static const char *push_url(lua_State *L, const struct cozy_transport *t, const struct cozy_request *rq) {
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  luaL_addstring(&b, t->base);
  luaL_addlstring(&b, rq->path, rq->path_len);
  if (rq->query && *rq->query) {
    luaL_addchar(&b, '?');
    luaL_addlstring(&b, rq->query, rq->query_len);
  }
  luaL_pushresult(&b);
  return lua_tostring(L, -1);
}

#define T_URL (COZY_REQ_DECODE + 1)
#define T_ATTEMPTS (COZY_REQ_DECODE + 2)

/* Records the attempts entry on top as entry n; runs on_retry on it when
** the request goes on. */
static void record(lua_State *L, struct cozy_transport *t, int n, int again) {
  lua_rawseti(L, T_ATTEMPTS, n);
  if (!again || lua_isnil(L, COZY_REQ_ON_RETRY)) return;
  lua_pushvalue(L, COZY_REQ_ON_RETRY);
  lua_rawgeti(L, T_ATTEMPTS, n);
  lua_call(L, 1, 0);
  if (t->closed) luaL_error(L, "transport closed by on_retry");
}

/* Each attempt waits for a rate-limit token and before_attempt, goes out,
** and cozy_after_attempt (transport_retry.c) says what follows; waits are
** sleeps under the caller's watch. */
static int t_request(lua_State *L) {
  struct cozy_transport *t = check_transport(L);
  struct cozy_request rq;
  struct cozy_attempts a = {0};
  enum cozy_after next = COZY_AFTER_DONE;
  const char *url;
  CURLcode rc = CURLE_OK;
  long status = 0;
  cozy_request_read(L, t, &rq);
  url = push_url(L, t, &rq); /* T_URL */
  lua_newtable(L); /* T_ATTEMPTS */
  t->watch = cozy_watches(L); /* a signal or its deadline ends the request */
  t->resp.end_at_line = rq.first_line;
  a.start = cozy_monotime();
  for (;;) {
    double detail = 0;
    int stop = cozy_ratelimit_wait(t, &detail);
    if (stop == COZY_GO) stop = ask_before_attempt(L, t, &rq, &a, &detail);
    if (stop == COZY_GO) stop = cozy_watch_poll(t->watch, cozy_monotime(), &detail);
    if (stop == COZY_GO) {
      rc = cozy_http_perform(t, rq.method, url, rq.body, rq.body_len, rq.ctype, cozy_attempt_begin(t, &a),
                             rq.read || rq.retry_safe, &status);
      next = cozy_after_attempt(L, t, &rq, &a, &t->x, rc, status);
      if (next == COZY_AFTER_REFRESH) next = cozy_refresh_after_401(L, t);
      record(L, t, a.n, next == COZY_AFTER_REPLAY || next == COZY_AFTER_RETRY);
      if (next == COZY_AFTER_DONE || next == COZY_AFTER_STOP) break;
      if (next == COZY_AFTER_REPLAY) continue;
      stop = cozy_watch_sleep(t->watch, a.delay, &detail);
      if (stop == COZY_GO) continue;
    }
    /* stopped before an attempt went out */
    cozy_push_stop(L, stop, detail, 0, cozy_monotime() - a.start);
    lua_rawseti(L, T_ATTEMPTS, a.n + 1);
    next = COZY_AFTER_STOP;
    break;
  }
  t->resp.end_at_line = 0;
  cozy_push_results(L, &t->resp, next == COZY_AFTER_STOP || rc != CURLE_OK, status,
                    lua_isnil(L, COZY_REQ_DECODE) ? 0 : COZY_REQ_DECODE, T_ATTEMPTS);
  return 5;
}

static const luaL_Reg t_methods[] = {{"request", t_request},
                                     {"multi", cozy_transport_multi},
                                     {"info", t_info},
                                     {"close", t_close},
                                     {NULL, NULL}};

static const luaL_Reg t_meta[] = {{"__gc", t_gc}, {"__close", t_close}, {"__index", NULL}, {NULL, NULL}};

/* transport.config{ kubeconfig=, context= } --> { namespace=, source=,
** context=, server= }, or nil and { file=, field=, message= }: the
** configuration as transport.new would find it, without connecting (an exec
** plugin is not run). The CLI takes the default --namespace from it. */
static int t_config(lua_State *L) {
  struct cozy_kubeconfig kc;
  struct cozy_config_error err;
  const char *path, *context;
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  path = opt_string(L, 1, "kubeconfig", NULL);
  context = opt_string(L, 1, "context", NULL);
  if (cozy_kubeconfig_load(path, context, &kc, &err) != 0) return push_config_error(L, &err);
  lua_createtable(L, 0, 4);
  set_str(L, "namespace", kc.namespace);
  set_str(L, "source", kc.source);
  set_str(L, "context", kc.context);
  set_str(L, "server", kc.server);
  cozy_kubeconfig_free(&kc);
  return 1;
}

/* A rehearsal's kubeconfig (endpoint = a cozy.endpoint on the stack's top,
** port =): its server https://127.0.0.1:port, its CA and its token, nothing
** of the engine's own configuration (core/endpoint.c). */
static int write_endpoint_kubeconfig(lua_State *L, const char *ns, char *dir) {
  struct cozy_kubeconfig kc;
  struct cozy_endpoint *ep = cozy_endpoint_check(L, -1);
  char server[64], file[4096], msg[512];
  lua_Integer port;
  int rc;
  lua_getfield(L, 1, "port");
  port = luaL_checkinteger(L, -1);
  luaL_argcheck(L, port > 0 && port < 65536, 1, "port must be a TCP port");
  memset(&kc, 0, sizeof kc);
  snprintf(server, sizeof server, "https://127.0.0.1:%d", (int)port);
  kc.server = server;
  kc.context = (char *)"rehearsal";
  kc.source = (char *)"rehearsal";
  kc.ca.data = (char *)cozy_endpoint_ca(ep, &kc.ca.len);
  kc.token.data = (char *)cozy_endpoint_token(ep, &kc.token.len);
  if (mkdtemp(dir) == NULL) { /* mode 0700 */
    snprintf(msg, sizeof msg, "cannot create a private directory: %s", strerror(errno));
    rc = -1;
  } else if ((rc = cozy_kubeconfig_write(&kc, ns, dir, file, sizeof file, msg, sizeof msg)) != 0) rmdir(dir);
  if (rc != 0) {
    lua_pushnil(L);
    lua_pushstring(L, msg);
    return 2;
  }
  lua_pushstring(L, file);
  lua_pushstring(L, dir);
  lua_pushstring(L, "rehearsal");
  return 3;
}

/* transport.write_kubeconfig{ kubeconfig=, context=, namespace= } -->
** path, dir, source (as config's): the configuration as transport.new would find it, written as
** a kubeconfig of one cluster, user and context (namespace `namespace`)
** into a new private directory under $TMPDIR (else /tmp); the caller
** removes both. nil and { file=, field=, message= } for a configuration
** error, nil and a message when the file cannot be written. An exec plugin
** is copied, not run. */
static int t_write_kubeconfig(lua_State *L) {
  struct cozy_kubeconfig kc;
  struct cozy_config_error err;
  const char *path, *context, *ns, *tmp = getenv("TMPDIR");
  char dir[4096], file[4096], msg[512], source[4096];
  int rc;
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  path = opt_string(L, 1, "kubeconfig", NULL);
  context = opt_string(L, 1, "context", NULL);
  ns = opt_string(L, 1, "namespace", NULL);
  luaL_argcheck(L, ns != NULL && *ns != '\0', 1, "namespace is required");
  if (tmp == NULL || *tmp != '/' || strlen(tmp) > 1024) tmp = "/tmp";
  snprintf(dir, sizeof dir, "%s/cozy-migrate-kubeconfig.XXXXXX", tmp);
  if (lua_getfield(L, 1, "endpoint") != LUA_TNIL) return write_endpoint_kubeconfig(L, ns, dir);
  lua_pop(L, 1);
  if (cozy_kubeconfig_load(path, context, &kc, &err) != 0) return push_config_error(L, &err);
  if (mkdtemp(dir) == NULL) { /* mode 0700 */
    snprintf(msg, sizeof msg, "cannot create a private directory under %s: %s", tmp, strerror(errno));
    rc = -1;
  } else if ((rc = cozy_kubeconfig_write(&kc, ns, dir, file, sizeof file, msg, sizeof msg)) != 0) rmdir(dir);
  /* freed before anything is pushed: a push that raises must not leak kc's secrets */
  snprintf(source, sizeof source, "%s", kc.source ? kc.source : "");
  cozy_kubeconfig_free(&kc);
  if (rc != 0) {
    lua_pushnil(L);
    lua_pushstring(L, msg);
    return 2;
  }
  lua_pushstring(L, file);
  lua_pushstring(L, dir);
  lua_pushstring(L, source);
  return 3;
}

static const luaL_Reg funcs[] = {{"new", t_new},
                                 {"config", t_config},
                                 {"write_kubeconfig", t_write_kubeconfig},
                                 {"retry_policy", cozy_lua_retry_policy},
                                 {"backoff", cozy_lua_backoff},
                                 {NULL, NULL}};

int luaopen_cozy_transport(lua_State *L) {
  if (luaL_newmetatable(L, TRANSPORT_MT)) {
    luaL_setfuncs(L, t_meta, 0);
    luaL_newlib(L, t_methods);
    lua_setfield(L, -2, "__index");
    lua_pushliteral(L, TRANSPORT_MT);
    lua_setfield(L, -2, "__name");
  }
  lua_pop(L, 1);
  cozy_multi_open(L);
  luaL_newlib(L, funcs);
  lua_pushliteral(L, "cozy-migrate/" COZY_MIGRATE_VERSION);
  lua_setfield(L, -2, "user_agent");
  return 1;
}
