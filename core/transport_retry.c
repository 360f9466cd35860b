/*
** The retry rule of the transport (docs/transport.md, "Retries"), the one
** engine of t:request (transport.c) and batches (transport_multi.c): which
** failures are worth another attempt, the one replay after a 401, how long
** to wait, what a watch's stop means, what before_attempt may answer, and
** the attempts entries a caller reads. The two callers differ only in how
** they wait: t:request sleeps, a batch parks the job and runs the others.
** The judge decides and never acts: credentials are the drivers' to read
** again (cozy_attempt_begin, cozy_refresh_after_401 in transport_http.c),
** and the waits' formula and bounds are the client's retry policy
** (retry_policy.c).
*/
#include <stdio.h>
#include <stdlib.h>

#include "lua.h"
#include "lauxlib.h"

#include "transport.h"

/* A transport failure's reason, whether retrying it can help, and whether
** the request certainly never left (no connection: safe to retry any write). */
static const char *curl_reason(CURLcode rc, int *transient, int *unsent) {
  *transient = 1;
  *unsent = 0;
  switch (rc) {
    case CURLE_COULDNT_CONNECT: *unsent = 1; return "ConnectionRefused";
    case CURLE_COULDNT_RESOLVE_HOST: *unsent = 1; return "DNSError";
    case CURLE_OPERATION_TIMEDOUT: return "Timeout";
    case CURLE_GOT_NOTHING: return "EOF";
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_PARTIAL_FILE: return "ConnectionReset";
    case CURLE_SSL_CONNECT_ERROR: return "TLSHandshake";
    case CURLE_FILESIZE_EXCEEDED: /* max_response_bytes: the same answer again */
      *transient = 0;
      return "ResponseTooLarge";
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_ENGINE_NOTFOUND: *transient = 0; return "TLSVerification";
    default: *transient = 0; return "TransportError";
  }
}

static int status_transient(long code) {
  return code == 429 || code == 500 || code == 502 || code == 503 || code == 504;
}

/* Pushes { code=, reason=, message=, retry_after=, elapsed_s= } for one attempt. */
static void push_attempt(lua_State *L, const struct cozy_exchange *x, CURLcode rc, long status,
                         const char *reason, double elapsed) {
  lua_createtable(L, 0, 5);
  lua_pushinteger(L, rc == CURLE_OK ? status : 0);
  lua_setfield(L, -2, "code");
  if (rc != CURLE_OK) {
    lua_pushstring(L, reason);
    lua_setfield(L, -2, "reason");
    lua_pushstring(L, x->errbuf[0] ? x->errbuf : curl_easy_strerror(rc));
    lua_setfield(L, -2, "message");
  } else if (x->resp->retry_after >= 0) {
    lua_pushnumber(L, x->resp->retry_after);
    lua_setfield(L, -2, "retry_after");
  }
  lua_pushnumber(L, elapsed);
  lua_setfield(L, -2, "elapsed_s");
}

/* The wait before retry n: the policy's backoff (retry_policy.c), jittered
** by the client's own generator. */
static double backoff(struct cozy_transport *t, int n) {
  return cozy_backoff_delay(&t->retry.backoff, n, (double)rand_r(&t->seed) / ((double)RAND_MAX + 1.0));
}

/* Whether attempt n (ended at `elapsed` s from the first) may be retried
** after *delay seconds: Retry-After or backoff, within the request's
** max_attempts/max_time (the client's, or what its caller lowered them to;
** refused_time for a refused connection, when shorter). */
static int within_bounds(struct cozy_transport *t, const struct cozy_request *rq,
                         const struct cozy_response *r, CURLcode rc, int n, double elapsed, double *delay) {
  double limit = rq->max_time;
  if (rc == CURLE_COULDNT_CONNECT && t->retry.refused_time < limit) limit = t->retry.refused_time;
  *delay = r->retry_after >= 0 && rc == CURLE_OK ? r->retry_after : backoff(t, n);
  if (*delay > t->retry.backoff.max_delay) *delay = t->retry.backoff.max_delay;
  return !(n >= rq->max_attempts || elapsed + *delay > limit);
}

/* Pushes the attempts entry of a request ended by the caller's watch:
** { code = 0, reason = "Interrupted" | "DeadlineExceeded", message, sent }. */
void cozy_push_stop(lua_State *L, int stop, double detail, int sent, double elapsed) {
  lua_createtable(L, 0, 6);
  lua_pushinteger(L, 0);
  lua_setfield(L, -2, "code");
  if (stop == COZY_STOP_SIGNAL) {
    lua_pushliteral(L, "Interrupted");
    lua_setfield(L, -2, "reason");
    lua_pushfstring(L, "interrupted by signal %d", (int)detail);
    lua_setfield(L, -2, "message");
    lua_pushinteger(L, (lua_Integer)detail);
    lua_setfield(L, -2, "signal");
  } else {
    lua_pushliteral(L, "DeadlineExceeded");
    lua_setfield(L, -2, "reason");
    lua_pushliteral(L, "the deadline passed");
    lua_setfield(L, -2, "message");
  }
  lua_pushboolean(L, sent);
  lua_setfield(L, -2, "sent");
  lua_pushnumber(L, elapsed);
  lua_setfield(L, -2, "elapsed_s");
}

/* The monotonic time by which an attempt starting now ends at the latest:
** its timeout, cut to the watch's deadline; 0 = unbounded. */
double cozy_attempt_deadline(const struct cozy_transport *t, double now, double timeout) {
  double d = timeout > 0 ? now + timeout : 0;
  if (t->watch != NULL && t->watch->top != NULL && t->watch->deadline > 0 &&
      (d == 0 || t->watch->deadline < d))
    d = t->watch->deadline;
  return d;
}

/* Why the watch ended the attempt, COZY_GO if it did not (into a->stop). */
static void judge_stop(struct cozy_transport *t, struct cozy_attempts *a, const struct cozy_exchange *x,
                       CURLcode rc) {
  a->stop = COZY_GO;
  a->stop_detail = 0;
  if (rc == CURLE_ABORTED_BY_CALLBACK && x->stop != COZY_GO) {
    a->stop = x->stop;
    a->stop_detail = x->stop_detail;
  } else if (rc == CURLE_OPERATION_TIMEDOUT) {
    /* cut to the watch's deadline (or a signal came): not a server timeout.
    ** libcurl's millisecond timer may end it a hair before the deadline. */
    a->stop = cozy_watch_poll(t->watch, cozy_monotime(), &a->stop_detail);
    if (a->stop == COZY_GO && t->watch != NULL && t->watch->top != NULL &&
        a->deadline == t->watch->deadline) {
      a->stop = COZY_STOP_DEADLINE;
      a->stop_detail = 0;
    }
  }
}

enum cozy_after cozy_after_attempt(lua_State *L, struct cozy_transport *t, const struct cozy_request *rq,
                                   struct cozy_attempts *a, const struct cozy_exchange *x, CURLcode rc,
                                   long status) {
  const char *reason = NULL;
  int transient = 0, unsent = 0, retry = 0;
  double elapsed;
  a->n++;
  a->delay = 0;
  elapsed = cozy_monotime() - a->start;
  judge_stop(t, a, x, rc);
  if (a->stop != COZY_GO) {
    cozy_push_stop(L, a->stop, a->stop_detail, 1, elapsed); /* the caller is stopping */
    return COZY_AFTER_STOP;
  }
  if (rc != CURLE_OK) {
    reason = curl_reason(rc, &transient, &unsent);
    retry = transient && (rq->read || rq->retry_safe || unsent);
  } else if (status == 401 && !a->did_401 && (t->kc.token_file || t->kc.exec)) {
    /* the token may have been rotated under us (a token file re-written, an
    ** exec plugin's credential revoked): worth reading it again and trying
    ** once more. The driver reads it (cozy_refresh_after_401): the judge
    ** only decides. */
    a->did_401 = 1;
    push_attempt(L, x, rc, status, NULL, elapsed);
    return COZY_AFTER_REFRESH;
  } else if (status_transient(status)) {
    retry = status == 429 || rq->read || rq->retry_safe;
  }
  push_attempt(L, x, rc, status, reason, elapsed);
  if (!retry || !within_bounds(t, rq, x->resp, rc, a->n, elapsed, &a->delay)) return COZY_AFTER_DONE;
  lua_pushnumber(L, a->delay);
  lua_setfield(L, -2, "after_s");
  return COZY_AFTER_RETRY;
}

void cozy_push_before_info(lua_State *L, const struct cozy_request *rq, const struct cozy_attempts *a,
                           lua_Integer id) {
  lua_createtable(L, 0, 5);
  lua_pushinteger(L, a->n + 1);
  lua_setfield(L, -2, "attempt");
  if (a->deadline > 0) {
    lua_pushnumber(L, a->deadline);
    lua_setfield(L, -2, "deadline");
  }
  lua_pushstring(L, rq->method);
  lua_setfield(L, -2, "method");
  lua_pushstring(L, rq->path);
  lua_setfield(L, -2, "path");
  if (id > 0) {
    lua_pushinteger(L, id);
    lua_setfield(L, -2, "id");
  }
}

/* nil or true sends the attempt, a number of seconds waits (interruptibly)
** and asks again; anything else is the caller's error. */
int cozy_before_answer(lua_State *L, struct cozy_transport *t, const struct cozy_request *rq,
                       const struct cozy_attempts *a, double *wait, double *detail, char *err,
                       size_t errlen) {
  int r;
  if (lua_isnil(L, -1) || (lua_isboolean(L, -1) && lua_toboolean(L, -1))) {
    lua_pop(L, 1);
    /* the attempt must end by the deadline announced */
    if (a->deadline == 0 || a->deadline > cozy_monotime()) return COZY_BEFORE_GO;
    r = cozy_watch_poll(t->watch, cozy_monotime(), detail);
    if (r != COZY_GO) return r;
    snprintf(err, errlen, "before_attempt used up the attempt's time (timeout %f s)", rq->timeout);
    return COZY_BEFORE_ERROR;
  }
  if (lua_type(L, -1) != LUA_TNUMBER || !(lua_tonumber(L, -1) >= 0)) {
    snprintf(err, errlen, "before_attempt must return nil, true or a number of seconds to wait, not %s",
             luaL_typename(L, -1));
    lua_pop(L, 1);
    return COZY_BEFORE_ERROR;
  }
  *wait = lua_tonumber(L, -1);
  lua_pop(L, 1);
  return COZY_BEFORE_WAIT;
}
