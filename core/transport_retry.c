/*
** The retry rule of the transport (docs/transport.md, "Retries"): which
** failures are worth another attempt, how long to wait, and the attempts
** entries a caller reads. Shared by t:request (transport.c) and batches
** (transport_multi.c), so that both follow exactly one rule.
*/
#include <stdlib.h>

#include "lua.h"
#include "lauxlib.h"

#include "transport.h"

/* A transport failure's reason, whether retrying it can help, and whether
** the request certainly never left (no connection: safe to retry any write). */
const char *cozy_curl_reason(CURLcode rc, int *transient, int *unsent) {
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

int cozy_status_transient(long code) {
  return code == 429 || code == 500 || code == 502 || code == 503 || code == 504;
}

/* Pushes { code=, reason=, message=, retry_after= } for one attempt. */
void cozy_push_attempt(lua_State *L, const struct cozy_exchange *x, const struct cozy_response *r,
                       CURLcode rc, long status, const char *reason, double elapsed) {
  lua_createtable(L, 0, 5);
  lua_pushinteger(L, rc == CURLE_OK ? status : 0);
  lua_setfield(L, -2, "code");
  if (rc != CURLE_OK) {
    lua_pushstring(L, reason);
    lua_setfield(L, -2, "reason");
    lua_pushstring(L, x->errbuf[0] ? x->errbuf : curl_easy_strerror(rc));
    lua_setfield(L, -2, "message");
  } else if (r->retry_after >= 0) {
    lua_pushnumber(L, r->retry_after);
    lua_setfield(L, -2, "retry_after");
  }
  lua_pushnumber(L, elapsed);
  lua_setfield(L, -2, "elapsed_s");
}

double cozy_backoff(struct cozy_transport *t, int n) {
  double d = t->retry.base_delay;
  double jitter;
  while (--n > 0 && d < t->retry.max_delay) d *= 2;
  if (d > t->retry.max_delay) d = t->retry.max_delay;
  /* jitter in [0.5, 1.5): spreads clients that failed together */
  jitter = 0.5 + (double)rand_r(&t->seed) / ((double)RAND_MAX + 1.0);
  return d * jitter;
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

int cozy_retry_within_bounds(struct cozy_transport *t, const struct cozy_response *r, CURLcode rc, int n,
                             double elapsed, double *delay) {
  *delay = r->retry_after >= 0 && rc == CURLE_OK ? r->retry_after : cozy_backoff(t, n);
  if (*delay > t->retry.max_delay) *delay = t->retry.max_delay;
  return !(n >= t->retry.max_attempts || elapsed + *delay > t->retry.max_time);
}
