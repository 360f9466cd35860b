/*
** Batches: independent requests of one client in parallel, on libcurl's
** multi interface, with bounded concurrency (docs/engine-api.md, cozy.transport).
**
**   local m = t:multi{ concurrency = 8 }
**   local id = m:submit(method, path, opts)   -- opts as for t:request
**   local id, status, body, attempts, warnings, decode_error = m:wait()  -- nil: none pending
**   m:pending()   m:close()  (also __gc and __close: cancels what is in flight)
**
** Each request follows exactly t:request's rules (transport_retry.c): its own
** retries and backoff, which wait without holding a slot or blocking the
** others; one token of the client's rate limiter per attempt, across the
** batch; before_attempt before every attempt; an armed proc.watch of the
** calling state stops every transfer and every wait of the batch.
**
** A request is a job: queued (in submit order), delayed (a backoff, a
** before_attempt wait, a 401 replay), in flight on one of at most
** `concurrency` easy handles, or done (waiting for m:wait). Lua values a job
** needs (body, callbacks, attempts) are anchored in the batch's user value.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lua.h"
#include "lauxlib.h"

#include "transport.h"

#define MULTI_MT "cozy.transport.multi"
#define MULTI_MAX_CONCURRENCY 64
#define MULTI_POLL_SLICE 0.1 /* longest wait between looks at the watch, seconds */

/* the anchor of a job: a table { body, before_attempt, on_retry, attempts, decode } */
enum { A_BODY = 1, A_BEFORE = 2, A_ON_RETRY = 3, A_ATTEMPTS = 4, A_DECODE = 5 };

struct job {
  struct job *next;
  lua_Integer id;
  char *method, *path, *url, *ctype; /* one allocation, at method */
  const char *body; /* anchored Lua string, or NULL */
  size_t body_len;
  int retry_safe, read, before, on_retry;
  double timeout;
  int n; /* attempts made */
  int did_401;
  int has_token; /* took its rate-limit token, waits for before_attempt */
  int stopped; /* ended by the watch */
  double start; /* when its first attempt was asked for; 0: not yet */
  double ready_at; /* delayed: when it may go */
  double deadline; /* of the attempt in flight (0: none) */
  CURLcode rc;
  long status;
  struct cozy_response *resp; /* from its first attempt on */
};

struct list {
  struct job *head, *tail;
};

struct cozy_multi {
  struct cozy_transport *t;
  CURLM *multi;
  int concurrency;
  struct cozy_exchange *slots; /* concurrency of them; slot->curl NULL until first use */
  int in_flight;
  struct list ready; /* may go now, oldest first */
  struct job *delayed; /* unordered */
  struct list done;
  lua_Integer next_id;
  int pending; /* submitted, not yet handed out by wait */
  int busy; /* a callback of one of its jobs is running */
  int stop; /* an attempt ended by the watch: the rest must end too */
  double stop_detail;
  int closed;
  struct cozy_multi *next_open; /* in t->multis */
};

static void push_back(struct list *l, struct job *j) {
  j->next = NULL;
  if (l->tail) l->tail->next = j;
  else l->head = j;
  l->tail = j;
}

static void push_front(struct list *l, struct job *j) {
  j->next = l->head;
  l->head = j;
  if (l->tail == NULL) l->tail = j;
}

static struct job *pop_front(struct list *l) {
  struct job *j = l->head;
  if (j) {
    l->head = j->next;
    if (l->head == NULL) l->tail = NULL;
    j->next = NULL;
  }
  return j;
}

static void job_free(struct job *j) {
  if (j->resp) {
    cozy_response_free(j->resp);
    free(j->resp);
  }
  free(j->method);
  free(j);
}

static void free_list(struct job *j) {
  while (j) {
    struct job *next = j->next;
    job_free(j);
    j = next;
  }
}

/* Cancels everything: transfers in flight, jobs waiting, results not taken. */
static void multi_cleanup(struct cozy_multi *m) {
  int i;
  struct cozy_multi **p;
  if (m->closed) return;
  m->closed = 1;
  for (i = 0; i < m->concurrency; i++) {
    struct cozy_exchange *x = &m->slots[i];
    if (x->curl == NULL) continue;
    if (x->owner) {
      curl_multi_remove_handle(m->multi, x->curl);
      job_free(x->owner);
      x->owner = NULL;
    }
    cozy_exchange_cleanup(x);
  }
  free(m->slots);
  m->slots = NULL;
  free_list(m->ready.head);
  free_list(m->delayed);
  free_list(m->done.head);
  m->ready.head = m->ready.tail = m->done.head = m->done.tail = NULL;
  m->delayed = NULL;
  m->in_flight = m->pending = 0;
  if (m->multi) curl_multi_cleanup(m->multi);
  m->multi = NULL;
  for (p = &m->t->multis; *p != NULL; p = &(*p)->next_open) {
    if (*p == m) {
      *p = m->next_open;
      break;
    }
  }
}

void cozy_multi_close_all(struct cozy_transport *t) {
  while (t->multis) multi_cleanup(t->multis);
}

int cozy_multi_busy(const struct cozy_transport *t) {
  const struct cozy_multi *m;
  for (m = t->multis; m != NULL; m = m->next_open)
    if (m->busy) return 1;
  return 0;
}

static struct cozy_multi *check_multi(lua_State *L) {
  struct cozy_multi *m = luaL_checkudata(L, 1, MULTI_MT);
  if (m->closed) luaL_argerror(L, 1, "batch is closed");
  if (m->busy) luaL_error(L, "batch used from a callback of one of its own requests");
  return m;
}

/* Pushes the job's anchor table. */
static void push_anchor(lua_State *L, int m_idx, const struct job *j) {
  lua_getiuservalue(L, m_idx, 1);
  lua_rawgeti(L, -1, j->id);
  lua_remove(L, -2);
}

/* Appends the entry on top of the stack to the job's attempts (as entry n). */
static void add_attempt(lua_State *L, int m_idx, const struct job *j, int n) {
  push_anchor(L, m_idx, j);
  lua_rawgeti(L, -1, A_ATTEMPTS);
  lua_pushvalue(L, -3);
  lua_rawseti(L, -2, n);
  lua_pop(L, 3);
}

static void finish(struct cozy_multi *m, struct job *j) {
  push_back(&m->done, j);
}

/* lua_error and luaL_error never return (they longjmp); saying so lets the
** compiler and the static analyser see that a dropped job is not used after. */
static void raise_top(lua_State *L) __attribute__((noreturn));
static void raise_top(lua_State *L) {
  lua_error(L);
  abort(); /* not reached */
}

static void raise_msg(lua_State *L, const char *msg) __attribute__((noreturn));
static void raise_msg(lua_State *L, const char *msg) {
  lua_pushstring(L, msg);
  raise_top(L);
}

/* Takes job j (in no list) out of the batch for good: its callback raised. */
static void drop_job(lua_State *L, int m_idx, struct cozy_multi *m, struct job *j) {
  lua_getiuservalue(L, m_idx, 1);
  lua_pushnil(L);
  lua_rawseti(L, -2, j->id);
  lua_pop(L, 1);
  m->pending--;
  job_free(j);
}

/* Runs one of the job's callbacks (function at index -2, argument at -1)
** protected: on an error the job leaves the batch and the error goes on to
** m:wait's caller, the other requests staying as they are. Returns with the
** callback's one result on the stack. */
static void call_back(lua_State *L, int m_idx, struct cozy_multi *m, struct job *j) {
  int rc;
  m->busy = 1;
  rc = lua_pcall(L, 1, 1, 0);
  m->busy = 0;
  if (m->closed) raise_msg(L, "batch closed by a callback");
  if (rc != LUA_OK) {
    drop_job(L, m_idx, m, j);
    raise_top(L);
  }
}

static void delay_job(struct cozy_multi *m, struct job *j, double at) {
  j->ready_at = at;
  j->next = m->delayed;
  m->delayed = j;
}

static void stop_job(lua_State *L, int m_idx, struct cozy_multi *m, struct job *j, int stop, double detail,
                     int sent) {
  double now = cozy_monotime();
  cozy_push_stop(L, stop, detail, sent, j->start > 0 ? now - j->start : 0);
  add_attempt(L, m_idx, j, sent ? j->n : j->n + 1);
  j->stopped = 1;
  finish(m, j);
}

/* The watch said stop: every transfer is aborted and every job ends. */
static void stop_all(lua_State *L, int m_idx, struct cozy_multi *m, int stop, double detail) {
  int i;
  struct job *j;
  for (i = 0; i < m->concurrency; i++) {
    struct cozy_exchange *x = &m->slots[i];
    long status;
    if (x->owner == NULL) continue;
    j = x->owner;
    x->owner = NULL;
    curl_multi_remove_handle(m->multi, x->curl);
    cozy_exchange_finish(x, CURLE_ABORTED_BY_CALLBACK, &status); /* wipes the headers */
    m->in_flight--;
    j->n++;
    stop_job(L, m_idx, m, j, stop, detail, 1);
  }
  while ((j = pop_front(&m->ready)) != NULL) stop_job(L, m_idx, m, j, stop, detail, 0);
  while ((j = m->delayed) != NULL) {
    m->delayed = j->next;
    stop_job(L, m_idx, m, j, stop, detail, 0);
  }
}

/* Asks before_attempt whether job j may go now. Returns COZY_GO with
** j->deadline set, -1 when it was delayed (the callback asked for a wait),
** or why the watch says stop (*detail). Raises the callback's error. */
static int ask_before(lua_State *L, int m_idx, struct cozy_multi *m, struct job *j, double *detail) {
  struct cozy_transport *t = m->t;
  double timeout = j->timeout;
  int r;
  j->deadline = cozy_attempt_deadline(t, cozy_monotime(), j->timeout);
  if (!j->before) return COZY_GO;
  push_anchor(L, m_idx, j);
  lua_rawgeti(L, -1, A_BEFORE);
  lua_createtable(L, 0, 5);
  lua_pushinteger(L, j->n + 1);
  lua_setfield(L, -2, "attempt");
  if (j->deadline > 0) {
    lua_pushnumber(L, j->deadline);
    lua_setfield(L, -2, "deadline");
  }
  lua_pushstring(L, j->method);
  lua_setfield(L, -2, "method");
  lua_pushstring(L, j->path);
  lua_setfield(L, -2, "path");
  lua_pushinteger(L, j->id);
  lua_setfield(L, -2, "id");
  call_back(L, m_idx, m, j);
  if (lua_isnil(L, -1) || (lua_isboolean(L, -1) && lua_toboolean(L, -1))) {
    lua_pop(L, 2);
    if (j->deadline == 0 || j->deadline > cozy_monotime()) return COZY_GO;
    r = cozy_watch_poll(t->watch, cozy_monotime(), detail);
    if (r != COZY_GO) return r;
    drop_job(L, m_idx, m, j);
    lua_pushfstring(L, "before_attempt used up the attempt's time (timeout %f s)", timeout);
    raise_top(L);
  }
  if (lua_type(L, -1) != LUA_TNUMBER || !(lua_tonumber(L, -1) >= 0)) {
    const char *type = luaL_typename(L, -1);
    drop_job(L, m_idx, m, j);
    lua_pushfstring(L, "before_attempt must return nil, true or a number of seconds to wait, not %s", type);
    raise_top(L);
  }
  delay_job(m, j, cozy_monotime() + lua_tonumber(L, -1));
  lua_pop(L, 2);
  return -1;
}

static struct cozy_exchange *free_slot(struct cozy_multi *m) {
  int i;
  for (i = 0; i < m->concurrency; i++) {
    struct cozy_exchange *x = &m->slots[i];
    if (x->curl == NULL) {
      if (cozy_exchange_init(m->t, x) != 0) {
        cozy_exchange_cleanup(x);
        return NULL;
      }
      return x;
    }
    if (x->owner == NULL) return x;
  }
  return NULL;
}

static void process_result(lua_State *L, int m_idx, struct cozy_multi *m, struct job *j,
                           struct cozy_exchange *x, CURLcode rc, long status);

/* Sends the job's next attempt on a free handle. */
static void start_job(lua_State *L, int m_idx, struct cozy_multi *m, struct job *j) {
  struct cozy_transport *t = m->t;
  struct cozy_exchange *x = free_slot(m);
  double now = cozy_monotime(), left;
  CURLcode rc;
  if (j->resp == NULL) {
    j->resp = calloc(1, sizeof *j->resp);
    if (j->resp == NULL) {
      drop_job(L, m_idx, m, j);
      raise_msg(L, "out of memory");
    }
    j->resp->max_response_bytes = t->max_response_bytes;
    j->resp->retry_after = -1;
  }
  if (x == NULL) {
    drop_job(L, m_idx, m, j);
    raise_msg(L, "cannot set up an HTTP handle for the batch");
  }
  if (t->kc.token_file && t->token_refresh > 0 && now - t->token_read_at >= t->token_refresh)
    cozy_http_reload_token(t);
  /* what is left of the attempt's time; never 0, which libcurl reads as "no timeout" */
  left = j->deadline > 0 ? j->deadline - now : 0;
  if (j->deadline > 0 && left < 0.002) left = 0.002;
  x->resp = j->resp;
  x->watch = t->watch;
  x->owner = j;
  m->in_flight++;
  rc = cozy_exchange_prepare(t, x, j->method, j->url, j->body, j->body_len, j->ctype, left,
                             j->read || j->retry_safe);
  if (rc == CURLE_OK) {
    CURLMcode mc = curl_multi_add_handle(m->multi, x->curl);
    if (mc == CURLM_OK) return;
    rc = CURLE_OUT_OF_MEMORY;
    snprintf(x->errbuf, sizeof x->errbuf, "curl_multi_add_handle failed: %s", curl_multi_strerror(mc));
  }
  {
    long status;
    rc = cozy_exchange_finish(x, rc, &status); /* wipes the headers */
  }
  process_result(L, m_idx, m, j, x, rc, 0);
}

/* An attempt of j ended (rc, status): the retry rule says what comes next. */
static void process_result(lua_State *L, int m_idx, struct cozy_multi *m, struct job *j,
                           struct cozy_exchange *x, CURLcode rc, long status) {
  struct cozy_transport *t = m->t;
  const char *reason = NULL;
  int transient = 0, unsent = 0, retry = 0, stop = COZY_GO;
  double stop_detail = 0, delay = 0, elapsed;
  x->owner = NULL;
  m->in_flight--;
  j->n++;
  j->rc = rc;
  j->status = status;
  elapsed = cozy_monotime() - j->start;
  if (rc == CURLE_ABORTED_BY_CALLBACK && x->stop != COZY_GO) {
    stop = x->stop;
    stop_detail = x->stop_detail;
  } else if (rc == CURLE_OPERATION_TIMEDOUT) {
    stop = cozy_watch_poll(t->watch, cozy_monotime(), &stop_detail);
    if (stop == COZY_GO && t->watch != NULL && t->watch->top != NULL && j->deadline == t->watch->deadline) {
      stop = COZY_STOP_DEADLINE;
      stop_detail = 0;
    }
  }
  if (stop != COZY_GO) {
    /* the attempt's time was cut to the watch's deadline (or a signal came):
    ** that holds for the whole batch, even when libcurl's timer fired a hair
    ** before the watch's clock says so */
    stop_job(L, m_idx, m, j, stop, stop_detail, 1);
    m->stop = stop;
    m->stop_detail = stop_detail;
    return;
  }
  if (rc != CURLE_OK) {
    reason = cozy_curl_reason(rc, &transient, &unsent);
    retry = transient && (j->read || j->retry_safe || unsent);
  } else if (status == 401 && !j->did_401 && t->kc.token_file) {
    j->did_401 = 1;
    cozy_http_reload_token(t);
    cozy_push_attempt(L, x, j->resp, rc, status, NULL, elapsed);
    add_attempt(L, m_idx, j, j->n);
    if (j->on_retry) {
      push_anchor(L, m_idx, j);
      lua_rawgeti(L, -1, A_ON_RETRY);
      lua_rawgeti(L, -2, A_ATTEMPTS);
      lua_rawgeti(L, -1, j->n);
      lua_remove(L, -2);
      call_back(L, m_idx, m, j);
      lua_pop(L, 2);
    }
    push_front(&m->ready, j);
    return;
  } else if (cozy_status_transient(status)) {
    retry = status == 429 || j->read || j->retry_safe;
  }
  cozy_push_attempt(L, x, j->resp, rc, status, reason, elapsed);
  if (retry) retry = cozy_retry_within_bounds(t, j->resp, rc, j->n, elapsed, &delay);
  if (retry) {
    lua_pushnumber(L, delay);
    lua_setfield(L, -2, "after_s");
  }
  add_attempt(L, m_idx, j, j->n);
  if (!retry) {
    finish(m, j);
    return;
  }
  if (j->on_retry) {
    push_anchor(L, m_idx, j);
    lua_rawgeti(L, -1, A_ON_RETRY);
    lua_rawgeti(L, -2, A_ATTEMPTS);
    lua_rawgeti(L, -1, j->n);
    lua_remove(L, -2);
    call_back(L, m_idx, m, j);
    lua_pop(L, 2);
  }
  delay_job(m, j, cozy_monotime() + delay);
}

/* Moves delayed jobs whose time has come to the front of the ready list;
** returns the earliest time one still waiting may go (0: none waits). */
static double promote(struct cozy_multi *m, double now) {
  struct job **p = &m->delayed;
  double next = 0;
  while (*p != NULL) {
    struct job *j = *p;
    if (j->ready_at <= now) {
      *p = j->next;
      push_front(&m->ready, j);
    } else {
      if (next == 0 || j->ready_at < next) next = j->ready_at;
      p = &j->next;
    }
  }
  return next;
}

/* Starts ready jobs while a slot and a token are there; returns when the
** next token comes (0: none is needed now). */
static double start_ready(lua_State *L, int m_idx, struct cozy_multi *m) {
  while (m->in_flight < m->concurrency && m->ready.head != NULL) {
    struct job *j = m->ready.head;
    double now = cozy_monotime(), detail = 0;
    int r;
    if (!j->has_token) {
      double wait = cozy_ratelimit_take(m->t, now);
      if (wait > 0) return now + wait;
      j->has_token = 1;
    }
    pop_front(&m->ready);
    if (j->start == 0) j->start = now;
    r = ask_before(L, m_idx, m, j, &detail);
    if (r == -1) continue; /* delayed, keeps its token */
    if (r != COZY_GO) {
      push_front(&m->ready, j); /* ends with all the others */
      stop_all(L, m_idx, m, r, detail);
      return 0;
    }
    j->has_token = 0;
    start_job(L, m_idx, m, j);
  }
  return 0;
}

/* Hands over what libcurl finished. */
static void collect(lua_State *L, int m_idx, struct cozy_multi *m) {
  CURLMsg *msg;
  int left;
  while ((msg = curl_multi_info_read(m->multi, &left)) != NULL) {
    struct cozy_exchange *x = NULL;
    CURL *e = msg->easy_handle;
    CURLcode rc = msg->data.result;
    long status;
    if (msg->msg != CURLMSG_DONE) continue;
    if (curl_easy_getinfo(e, CURLINFO_PRIVATE, (char **)&x) != CURLE_OK || x == NULL || x->owner == NULL)
      continue;
    curl_multi_remove_handle(m->multi, e);
    rc = cozy_exchange_finish(x, rc, &status);
    process_result(L, m_idx, m, x->owner, x, rc, status);
  }
}

/* Pushes the results of a done job and frees it: id, status, body,
** attempts, warnings, decode_error (t:request's). */
static int hand_over(lua_State *L, int m_idx, struct cozy_multi *m) {
  struct job *j = pop_front(&m->done);
  int failed = j->stopped || j->rc != CURLE_OK, anchor;
  lua_pushinteger(L, j->id);
  push_anchor(L, m_idx, j);
  anchor = lua_gettop(L);
  lua_rawgeti(L, anchor, A_ATTEMPTS);
  lua_rawgeti(L, anchor, A_DECODE);
  cozy_push_results(L, j->resp, failed, j->status, lua_isnil(L, -1) ? 0 : anchor + 2, anchor + 1);
  lua_rotate(L, anchor, -3); /* the anchor, its attempts and decode option on top, */
  lua_pop(L, 3); /* and gone: the id, then the results */
  lua_getiuservalue(L, m_idx, 1);
  lua_pushnil(L);
  lua_rawseti(L, -2, j->id);
  lua_pop(L, 1);
  m->pending--;
  job_free(j);
  return 6;
}

/* m:wait() -> id, status, body, attempts, warnings, decode_error | nil */
static int m_wait(lua_State *L) {
  struct cozy_multi *m = check_multi(L);
  struct cozy_transport *t = m->t;
  int i;
  lua_settop(L, 1);
  if (t->closed) return luaL_error(L, "transport is closed");
  if (m->pending == 0) {
    lua_pushnil(L);
    return 1;
  }
  t->watch = cozy_watches(L);
  for (i = 0; i < m->concurrency; i++) m->slots[i].watch = t->watch;
  for (;;) {
    double now, next = 0, token_at = 0, detail = 0, wait;
    int stop;
    /* one round even when a result is there: slots freed by finished
    ** transfers are filled again before their result is handed over */
    now = cozy_monotime();
    stop = cozy_watch_poll(t->watch, now, &detail);
    if (stop == COZY_GO && m->stop != COZY_GO) {
      stop = m->stop;
      detail = m->stop_detail;
    }
    m->stop = COZY_GO;
    if (stop != COZY_GO) {
      stop_all(L, 1, m, stop, detail);
    } else {
      next = promote(m, now);
      token_at = start_ready(L, 1, m);
      if (m->in_flight > 0) {
        int running;
        CURLMcode mc = curl_multi_perform(m->multi, &running);
        if (mc != CURLM_OK) return luaL_error(L, "curl_multi_perform failed: %s", curl_multi_strerror(mc));
        collect(L, 1, m);
      }
    }
    if (m->done.head) return hand_over(L, 1, m);
    if (m->in_flight == 0 && m->ready.head == NULL && m->delayed == NULL)
      return luaL_error(L, "batch lost track of %d requests (a bug)", m->pending); /* never a hang */
    /* nothing to hand over: wait for a transfer, a delay, a token or the watch */
    now = cozy_monotime();
    wait = MULTI_POLL_SLICE;
    if (next > 0 && next - now < wait) wait = next - now;
    if (token_at > 0 && token_at - now < wait) wait = token_at - now;
    if (t->watch != NULL && t->watch->top != NULL && t->watch->deadline > 0 &&
        t->watch->deadline - now < wait)
      wait = t->watch->deadline - now + 1e-4;
    if (wait < 0) wait = 0;
    if (m->in_flight > 0) {
      CURLMcode mc;
      long curl_ms = -1;
      if (curl_multi_timeout(m->multi, &curl_ms) == CURLM_OK && curl_ms >= 0 && curl_ms / 1000.0 < wait)
        wait = curl_ms / 1000.0;
      mc = curl_multi_poll(m->multi, NULL, 0, (int)(wait * 1000 + 0.999), NULL);
      if (mc != CURLM_OK) return luaL_error(L, "curl_multi_poll failed: %s", curl_multi_strerror(mc));
    } else if (wait > 0) {
      cozy_watch_sleep(t->watch, wait, &detail); /* a stop is seen at the top of the loop */
    }
  }
}

static int opt_function(lua_State *L, int idx, const char *key) {
  lua_getfield(L, idx, key);
  if (lua_isnil(L, -1)) return 0;
  if (!lua_isfunction(L, -1)) return luaL_error(L, "option '%s' must be a function", key);
  return 1;
}

static const char *opt_str(lua_State *L, int idx, const char *key, size_t *len) {
  lua_getfield(L, idx, key);
  if (lua_isnil(L, -1)) return NULL;
  if (lua_type(L, -1) != LUA_TSTRING) luaL_error(L, "option '%s' must be a string", key);
  return lua_tolstring(L, -1, len);
}

/* A job for the request, in one allocation for its strings (the URL is
** the server, the path and the query); NULL when out of memory. Pure C:
** nothing here can raise, so nothing allocated can be stranded by an error. */
static struct job *job_new(const char *server, const char *method, size_t method_len, const char *path,
                           size_t path_len, const char *query, size_t query_len, const char *ctype,
                           size_t ctype_len) {
  size_t server_len = strlen(server);
  size_t url_len = server_len + path_len + (query && *query ? 1 + query_len : 0);
  size_t total = method_len + 1 + path_len + 1 + url_len + 1 + (ctype ? ctype_len + 1 : 0);
  struct job *j = calloc(1, sizeof *j);
  char *p = malloc(total);
  if (j == NULL || p == NULL) {
    free(j);
    free(p);
    return NULL;
  }
  j->method = p;
  memcpy(p, method, method_len + 1);
  p += method_len + 1;
  j->path = p;
  memcpy(p, path, path_len + 1);
  p += path_len + 1;
  j->url = p;
  memcpy(p, server, server_len);
  memcpy(p + server_len, path, path_len);
  p += server_len + path_len;
  if (query && *query) {
    *p++ = '?';
    memcpy(p, query, query_len);
    p += query_len;
  }
  *p++ = '\0';
  if (ctype) {
    j->ctype = p;
    memcpy(p, ctype, ctype_len + 1);
  }
  j->rc = CURLE_OK;
  return j;
}

/* m:submit(method, path, opts) -> id: checked as t:request checks it.
** Every option is read (an __index may raise) and the anchor stored (which
** may raise out of memory) before the job is allocated; from there on
** nothing raises but the allocation's own failure. */
static int m_submit(lua_State *L) {
  struct cozy_multi *m = check_multi(L);
  struct cozy_transport *t = m->t;
  size_t method_len, path_len, query_len = 0, ctype_len = 0;
  const char *method = luaL_checklstring(L, 2, &method_len);
  const char *path = luaL_checklstring(L, 3, &path_len);
  const char *query, *ctype;
  int retry_safe;
  double timeout;
  lua_Integer id;
  struct job *j;
  if (t->closed) return luaL_error(L, "transport is closed");
  luaL_argcheck(L, path[0] == '/', 3, "path must start with '/'");
  luaL_argcheck(L, method_len > 0 && strspn(method, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") == method_len, 2,
                "method must be an HTTP method in capitals");
  luaL_argcheck(L, !cozy_bad_http_text(path, path_len, 1), 3,
                "path contains a space or a control character (CR, LF, NUL...)");
  if (lua_isnoneornil(L, 4)) {
    lua_settop(L, 3);
    lua_newtable(L);
  }
  luaL_checktype(L, 4, LUA_TTABLE);
  lua_settop(L, 4);
  lua_createtable(L, 5, 0); /* 5: the anchor */
  query = opt_str(L, 4, "query", &query_len); /* 6 */
  if (query && cozy_bad_http_text(query, query_len, 1))
    return luaL_argerror(L, 4, "query contains a space or a control character (CR, LF, NUL...)");
  ctype = opt_str(L, 4, "content_type", &ctype_len); /* 7 */
  if (ctype && cozy_bad_http_text(ctype, ctype_len, 0))
    return luaL_argerror(L, 4,
                         "content_type contains a control character (CR, LF, NUL...): "
                         "it would split the Content-Type header");
  if (ctype && ctype_len > 200) return luaL_argerror(L, 4, "content_type is longer than 200 bytes");
  lua_getfield(L, 4, "body"); /* 8 */
  if (!lua_isnil(L, 8)) {
    luaL_checklstring(L, 8, NULL);
    lua_pushvalue(L, 8);
    lua_rawseti(L, 5, A_BODY);
  }
  lua_getfield(L, 4, "timeout");
  if (!lua_isnil(L, -1) && (!lua_isnumber(L, -1) || lua_tonumber(L, -1) < 0))
    return luaL_error(L, "option 'timeout' must be a number >= 0");
  timeout = lua_isnil(L, -1) ? t->request_timeout : lua_tonumber(L, -1);
  lua_pop(L, 1);
  lua_getfield(L, 4, "retry_safe");
  retry_safe = lua_toboolean(L, -1);
  lua_pop(L, 1);
  if (opt_function(L, 4, "before_attempt")) lua_rawseti(L, 5, A_BEFORE);
  else lua_pop(L, 1);
  if (opt_function(L, 4, "on_retry")) lua_rawseti(L, 5, A_ON_RETRY);
  else lua_pop(L, 1);
  lua_getfield(L, 4, "decode");
  cozy_decode_option(L, lua_gettop(L));
  lua_rawseti(L, 5, A_DECODE);
  lua_newtable(L);
  lua_rawseti(L, 5, A_ATTEMPTS);
  id = m->next_id + 1;
  lua_getiuservalue(L, 1, 1); /* 9: the anchors */
  lua_pushvalue(L, 5);
  lua_rawseti(L, 9, id);

  j = job_new(t->kc.server, method, method_len, path, path_len, query, query_len, ctype, ctype_len);
  if (j == NULL) {
    lua_pushnil(L); /* clearing a key never allocates */
    lua_rawseti(L, 9, id);
    return luaL_error(L, "out of memory");
  }
  if (!lua_isnil(L, 8)) j->body = lua_tolstring(L, 8, &j->body_len);
  j->retry_safe = retry_safe;
  j->timeout = timeout;
  j->read = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
  j->before = lua_rawgeti(L, 5, A_BEFORE) != LUA_TNIL;
  j->on_retry = lua_rawgeti(L, 5, A_ON_RETRY) != LUA_TNIL;
  j->id = m->next_id = id;
  push_back(&m->ready, j);
  m->pending++;
  lua_pushinteger(L, j->id);
  return 1;
}

static int m_pending(lua_State *L) {
  struct cozy_multi *m = luaL_checkudata(L, 1, MULTI_MT);
  lua_pushinteger(L, m->closed ? 0 : m->pending);
  return 1;
}

static int m_gc(lua_State *L) {
  struct cozy_multi *m = luaL_checkudata(L, 1, MULTI_MT);
  multi_cleanup(m);
  return 0;
}

static int m_close(lua_State *L) {
  struct cozy_multi *m = luaL_checkudata(L, 1, MULTI_MT);
  if (m->busy) return luaL_error(L, "batch closed by a callback of one of its own requests");
  return m_gc(L);
}

/* t:multi{ concurrency = N } -> batch */
int cozy_transport_multi(lua_State *L) {
  struct cozy_transport *t = luaL_checkudata(L, 1, "cozy.transport");
  struct cozy_multi *m;
  lua_Integer concurrency = 1;
  if (t->closed) return luaL_argerror(L, 1, "transport is closed");
  if (!lua_isnoneornil(L, 2)) {
    luaL_checktype(L, 2, LUA_TTABLE);
    lua_getfield(L, 2, "concurrency");
    if (!lua_isnil(L, -1)) {
      int isint;
      concurrency = lua_tointegerx(L, -1, &isint);
      if (!isint || concurrency < 1 || concurrency > MULTI_MAX_CONCURRENCY)
        return luaL_error(L, "option 'concurrency' must be an integer from 1 to %d", MULTI_MAX_CONCURRENCY);
    }
    lua_pop(L, 1);
  }
  m = lua_newuserdatauv(L, sizeof *m, 2);
  memset(m, 0, sizeof *m);
  m->closed = 1; /* until set up */
  m->t = t;
  luaL_setmetatable(L, MULTI_MT);
  lua_newtable(L);
  lua_setiuservalue(L, -2, 1); /* the anchors */
  lua_pushvalue(L, 1);
  lua_setiuservalue(L, -2, 2); /* the client outlives its batches */
  m->concurrency = (int)concurrency;
  m->slots = calloc((size_t)concurrency, sizeof *m->slots);
  if (m->slots == NULL) return luaL_error(L, "out of memory");
  m->multi = curl_multi_init();
  if (m->multi == NULL) {
    free(m->slots);
    m->slots = NULL;
    return luaL_error(L, "curl_multi_init failed");
  }
  /* HTTP/1.1 carries one request per connection at a time: keep as many
  ** connections as requests in flight, plus the one t:request uses */
  curl_multi_setopt(m->multi, CURLMOPT_MAXCONNECTS, (long)concurrency + 1);
  m->closed = 0;
  m->next_open = t->multis;
  t->multis = m;
  return 1;
}

static const luaL_Reg m_methods[] = {
    {"submit", m_submit}, {"wait", m_wait}, {"pending", m_pending}, {"close", m_close}, {NULL, NULL}};

void cozy_multi_open(lua_State *L) {
  if (luaL_newmetatable(L, MULTI_MT)) {
    luaL_newlib(L, m_methods);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, m_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, m_close);
    lua_setfield(L, -2, "__close");
    lua_pushliteral(L, MULTI_MT);
    lua_setfield(L, -2, "__name");
  }
  lua_pop(L, 1);
}
