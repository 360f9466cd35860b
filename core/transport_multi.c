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
  /* method, path, ctype and url in one allocation, at rq.method; the body
  ** an anchored Lua string; rq.query is not kept (it is in the url) */
  struct cozy_request rq;
  char *url;
  struct cozy_attempts a;
  int before, on_retry;
  int has_token; /* took its rate-limit token, waits for before_attempt */
  int stopped; /* ended by the watch */
  double ready_at; /* delayed: when it may go */
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
  /* the job out of every list while C code works on it (between two of
  ** its places): a memory error raised meanwhile leaves it here, and the
  ** batch's next m:submit, m:wait or close takes it out, so it is freed on
  ** that way out too */
  struct job *loose;
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
  free((char *)j->rq.method);
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
  if (m->loose) job_free(m->loose);
  m->loose = NULL;
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

static void drop_job(lua_State *L, int m_idx, struct cozy_multi *m, struct job *j);

/* The batch at index 1, usable; a job a raised error left loose is dropped. */
static struct cozy_multi *check_multi(lua_State *L) {
  struct cozy_multi *m = luaL_checkudata(L, 1, MULTI_MT);
  if (m->closed) luaL_argerror(L, 1, "batch is closed");
  if (m->busy) luaL_error(L, "batch used from a callback of one of its own requests");
  if (m->loose) drop_job(L, 1, m, m->loose);
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
  m->loose = NULL;
}

/* Back to the front of the ready list (a stop or a replay comes first). */
static void requeue(struct cozy_multi *m, struct job *j) {
  push_front(&m->ready, j);
  m->loose = NULL;
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

/* Takes job j (in no list) out of the batch for good: handed over, or its
** callback raised. */
static void drop_job(lua_State *L, int m_idx, struct cozy_multi *m, struct job *j) {
  lua_getiuservalue(L, m_idx, 1);
  lua_pushnil(L);
  lua_rawseti(L, -2, j->id);
  lua_pop(L, 1);
  m->pending--;
  if (m->loose == j) m->loose = NULL;
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
  m->loose = NULL;
}

static void stop_job(lua_State *L, int m_idx, struct cozy_multi *m, struct job *j, int stop, double detail,
                     int sent) {
  double now = cozy_monotime();
  m->loose = j;
  cozy_push_stop(L, stop, detail, sent, j->a.start > 0 ? now - j->a.start : 0);
  add_attempt(L, m_idx, j, sent ? j->a.n : j->a.n + 1);
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
    j->a.n++;
    stop_job(L, m_idx, m, j, stop, detail, 1);
  }
  while ((j = pop_front(&m->ready)) != NULL) stop_job(L, m_idx, m, j, stop, detail, 0);
  while ((j = m->delayed) != NULL) {
    m->delayed = j->next;
    stop_job(L, m_idx, m, j, stop, detail, 0);
  }
}

/* Asks before_attempt whether job j may go now. Returns COZY_GO with
** j->a.deadline set, -1 when it was delayed (the callback asked for a wait),
** or why the watch says stop (*detail). Raises the callback's error. */
static int ask_before(lua_State *L, int m_idx, struct cozy_multi *m, struct job *j, double *detail) {
  char err[160];
  double wait = 0;
  int r;
  j->a.deadline = cozy_attempt_deadline(m->t, cozy_monotime(), j->rq.timeout);
  if (!j->before) return COZY_GO;
  push_anchor(L, m_idx, j);
  lua_rawgeti(L, -1, A_BEFORE);
  cozy_push_before_info(L, &j->rq, &j->a, j->id);
  call_back(L, m_idx, m, j);
  r = cozy_before_answer(L, m->t, &j->rq, &j->a, &wait, detail, err, sizeof err);
  lua_pop(L, 1); /* the anchor */
  if (r == COZY_BEFORE_ERROR) {
    drop_job(L, m_idx, m, j);
    raise_msg(L, err);
  }
  if (r != COZY_BEFORE_WAIT) return r;
  delay_job(m, j, cozy_monotime() + wait);
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
  x->resp = j->resp;
  x->watch = t->watch;
  x->owner = j;
  m->loose = NULL;
  m->in_flight++;
  rc = cozy_exchange_prepare(t, x, j->rq.method, j->url, j->rq.body, j->rq.body_len, j->rq.ctype,
                             cozy_attempt_begin(t, &j->a), j->rq.read || j->rq.retry_safe);
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

/* An attempt of j ended (rc, status): the retry rule (transport_retry.c)
** says what comes next; a wait parks the job without holding its slot. */
static void process_result(lua_State *L, int m_idx, struct cozy_multi *m, struct job *j,
                           struct cozy_exchange *x, CURLcode rc, long status) {
  enum cozy_after next;
  x->owner = NULL;
  m->loose = j;
  m->in_flight--;
  j->rc = rc;
  j->status = status;
  next = cozy_after_attempt(L, m->t, &j->rq, &j->a, x, rc, status);
  /* a 401 the judge finds worth a replay: the credential is the driver's to read */
  if (next == COZY_AFTER_REFRESH) next = cozy_refresh_after_401(L, m->t);
  add_attempt(L, m_idx, j, j->a.n);
  if (next == COZY_AFTER_STOP) {
    /* the attempt's time was cut to the watch's deadline (or a signal came):
    ** that holds for the whole batch, even when libcurl's timer fired a hair
    ** before the watch's clock says so */
    j->stopped = 1;
    finish(m, j);
    m->stop = j->a.stop;
    m->stop_detail = j->a.stop_detail;
    return;
  }
  if (next == COZY_AFTER_DONE) {
    finish(m, j);
    return;
  }
  if (j->on_retry) {
    push_anchor(L, m_idx, j);
    lua_rawgeti(L, -1, A_ON_RETRY);
    lua_rawgeti(L, -2, A_ATTEMPTS);
    lua_rawgeti(L, -1, j->a.n);
    lua_remove(L, -2);
    call_back(L, m_idx, m, j);
    lua_pop(L, 2);
  }
  if (next == COZY_AFTER_REPLAY) requeue(m, j);
  else delay_job(m, j, cozy_monotime() + j->a.delay);
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
    m->loose = pop_front(&m->ready);
    if (j->a.start == 0) j->a.start = now;
    r = ask_before(L, m_idx, m, j, &detail);
    if (r == -1) continue; /* delayed, keeps its token */
    if (r != COZY_GO) {
      requeue(m, j); /* ends with all the others */
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
  struct job *j = m->loose = pop_front(&m->done);
  int failed = j->stopped || j->rc != CURLE_OK, anchor;
  lua_pushinteger(L, j->id);
  push_anchor(L, m_idx, j);
  anchor = lua_gettop(L);
  lua_rawgeti(L, anchor, A_ATTEMPTS);
  lua_rawgeti(L, anchor, A_DECODE);
  cozy_push_results(L, j->resp, failed, j->status, lua_isnil(L, -1) ? 0 : anchor + 2, anchor + 1);
  lua_rotate(L, anchor, -3); /* the anchor, its attempts and decode option on top, */
  lua_pop(L, 3); /* and gone: the id, then the results */
  drop_job(L, m_idx, m, j);
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

/* A job for the request, its method, path, content type and URL (the
** server, the path and the query) copied in one allocation; NULL when out
** of memory. Pure C: nothing here can raise, so nothing allocated can be
** stranded by an error. */
static struct job *job_new(const char *server, const struct cozy_request *rq) {
  size_t server_len = strlen(server);
  int has_query = rq->query && *rq->query;
  size_t url_len = server_len + rq->path_len + (has_query ? 1 + rq->query_len : 0);
  size_t total = rq->method_len + 1 + rq->path_len + 1 + url_len + 1 + (rq->ctype ? rq->ctype_len + 1 : 0);
  struct job *j = calloc(1, sizeof *j);
  char *p = malloc(total);
  if (j == NULL || p == NULL) {
    free(j);
    free(p);
    return NULL;
  }
  j->rq = *rq;
  j->rq.query = NULL;
  j->rq.method = memcpy(p, rq->method, rq->method_len + 1);
  p += rq->method_len + 1;
  j->rq.path = memcpy(p, rq->path, rq->path_len + 1);
  p += rq->path_len + 1;
  j->url = p;
  memcpy(p, server, server_len);
  memcpy(p + server_len, rq->path, rq->path_len);
  p += server_len + rq->path_len;
  if (has_query) {
    *p++ = '?';
    memcpy(p, rq->query, rq->query_len);
    p += rq->query_len;
  }
  *p++ = '\0';
  if (rq->ctype) j->rq.ctype = memcpy(p, rq->ctype, rq->ctype_len + 1);
  j->rc = CURLE_OK;
  return j;
}

/* m:submit(method, path, opts) -> id: read by t:request's parser. Every
** option is read (an __index may raise) and the anchor stored (which may
** raise out of memory) before the job is allocated; from there on nothing
** raises but the allocation's own failure. */
static int m_submit(lua_State *L) {
  struct cozy_multi *m = check_multi(L);
  struct cozy_transport *t = m->t;
  struct cozy_request rq;
  lua_Integer id = m->next_id + 1;
  struct job *j;
  if (t->closed) return luaL_error(L, "transport is closed");
  cozy_request_read(L, t, &rq);
  lua_createtable(L, 5, 0); /* the anchor: the Lua values the job needs */
  lua_pushvalue(L, COZY_REQ_BODY);
  lua_rawseti(L, -2, A_BODY);
  lua_pushvalue(L, COZY_REQ_BEFORE);
  lua_rawseti(L, -2, A_BEFORE);
  lua_pushvalue(L, COZY_REQ_ON_RETRY);
  lua_rawseti(L, -2, A_ON_RETRY);
  lua_newtable(L);
  lua_rawseti(L, -2, A_ATTEMPTS);
  lua_pushvalue(L, COZY_REQ_DECODE);
  lua_rawseti(L, -2, A_DECODE);
  lua_getiuservalue(L, 1, 1); /* the anchors */
  lua_insert(L, -2);
  lua_rawseti(L, -2, id);
  j = job_new(t->base, &rq);
  if (j == NULL) {
    lua_pushnil(L); /* clearing a key never allocates */
    lua_rawseti(L, -2, id);
    return luaL_error(L, "out of memory");
  }
  j->before = !lua_isnil(L, COZY_REQ_BEFORE);
  j->on_retry = !lua_isnil(L, COZY_REQ_ON_RETRY);
  j->id = m->next_id = id;
  push_back(&m->ready, j);
  m->pending++;
  lua_pushinteger(L, j->id);
  return 1;
}

static int m_pending(lua_State *L) {
  struct cozy_multi *m = luaL_checkudata(L, 1, MULTI_MT);
  /* a loose job is as good as dropped (check_multi drops it) */
  lua_pushinteger(L, m->closed ? 0 : m->pending - (m->loose != NULL));
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
