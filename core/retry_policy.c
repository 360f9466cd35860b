/*
** The engine's retry policies and its one backoff formula (docs/transport.md,
** "Retries" and "Retry policies"). Every wait between two tries of the same
** thing, in C (a transport's retries, core/transport_retry.c) or in Lua (the
** update engine's conflicts, the lock's wait), is cozy_backoff_delay of a
** policy named here; a caller picks a policy by name and overrides a value
** only when it is derived from something else (a renewal's time from the
** lease's interval).
**
**   transport.retry_policy(name [, overrides]) --> a fresh table { name=,
**       max_attempts=, max_time=, base_delay=, factor=, max_delay=, jitter=,
**       refused_time= }
**   transport.backoff(policy, n [, u]) --> seconds to wait before retry n
**       (n >= 1); policy a name or such a table; u in [0, 1), default a
**       draw of math.random
**   transport.new{ retry = name | table } (core/transport.c): a table is
**       the policy its `name` says ("request" without one), overridden by
**       its other fields
*/
#include <limits.h>
#include <math.h>
#include <string.h>

#include "lua.h"
#include "lauxlib.h"

#include "transport.h"

/* A number of seconds for "no bound of its own" (a Lua math.huge). */
#define UNBOUNDED HUGE_VAL

static const struct cozy_retry_policy policies[] = {
    /* A request of any client unless it says otherwise (transport.new's
    ** defaults). client-go retries up to 10 times too; 120 s rides out an
    ** API server restart or a leader election; 0.25 s doubling to 30 s
    ** spaces the tries of an overloaded server; jitter [0.5, 1.5) spreads
    ** clients that failed together. A refused connection is retried for
    ** COZY_REFUSED_TIME_DEFAULT only (see there). */
    {"request", 10, 120, {0.25, 2, 30, 1}, COZY_REFUSED_TIME_DEFAULT},
    /* An optimistic-concurrency conflict of the update engine (a 409, a
    ** test op refused), retried by computing the change again: client-go's
    ** DefaultBackoff is 4 steps of 10 ms x5 (jitter 0.1); we allow more
    ** attempts, grow slower and cap the wait, so a busy object (a VM whose
    ** status virt-controller keeps writing) still gets its change in
    ** without multi-second sleeps. Its time bound is the caller's deadline,
    ** and it makes no connection of its own: no max_time, no refused_time. */
    {"conflict", 8, UNBOUNDED, {0.01, 3, 2, 0.5}, 0},
    /* A lease renewal (runner/lease.lua): worth retrying only within its
    ** interval (a third of the lease), after which the next renewal is due,
    ** and waits of at most half of it, so that two tries fit. The numbers
    ** below are for the default 30 s lease; the renewal loop derives
    ** max_time and max_delay from the lease it renews. 0.1 s: a renewal
    ** is one small write, cheap to try again soon. */
    {"renewal", 3, 10, {0.1, 2, 5, 1}, COZY_REFUSED_TIME_DEFAULT},
    /* `check`'s reachability probe: a preflight answers quickly, so one
    ** more try within 10 s, not the request budget's 2 minutes. */
    {"probe", 2, 10, {0.25, 2, 30, 1}, COZY_REFUSED_TIME_DEFAULT},
    /* A Kubernetes Event of the run (runner/events.lua): best effort, on a
    ** quick connection of its own; a slow or refusing server must cost the
    ** run seconds at most, so one more try within 2 s. */
    {"events", 2, 2, {0.25, 2, 30, 1}, COZY_REFUSED_TIME_DEFAULT},
    /* The lock's release after a failed or interrupted run: best effort and
    ** quick, since an unreleased lease only expires while a release retried
    ** for minutes holds the failed run (and its exit). */
    {"release", 2, 5, {0.25, 2, 30, 1}, COZY_REFUSED_TIME_DEFAULT},
    /* The record of a failed step in the stamp, written before the
    ** release: as quick as the release, and a Retry-After is cut to 1 s so
    ** that the record cannot hold a stopping Job. */
    {"record", 2, 5, {0.25, 2, 1, 1}, COZY_REFUSED_TIME_DEFAULT},
};

#define NPOLICIES (sizeof policies / sizeof policies[0])

double cozy_backoff_delay(const struct cozy_backoff *b, int n, double u) {
  double d = 0;
  /* base 0 waits 0 (0 x inf would be NaN); a huge n is the cap */
  if (b->base_delay > 0) d = b->base_delay * pow(b->factor, n > 1 ? n - 1 : 0);
  if (!(d <= b->max_delay)) d = b->max_delay;
  return d * (1 - b->jitter / 2 + b->jitter * u);
}

const struct cozy_retry_policy *cozy_retry_policy_find(const char *name) {
  size_t i;
  for (i = 0; i < NPOLICIES; i++)
    if (strcmp(policies[i].name, name) == 0) return &policies[i];
  return NULL;
}

static int unknown_policy(lua_State *L, const char *name) {
  luaL_Buffer b;
  size_t i;
  luaL_buffinit(L, &b);
  luaL_addstring(&b, "unknown retry policy '");
  luaL_addstring(&b, name);
  luaL_addstring(&b, "' (one of: ");
  for (i = 0; i < NPOLICIES; i++) {
    if (i > 0) luaL_addstring(&b, ", ");
    luaL_addstring(&b, policies[i].name);
  }
  luaL_addchar(&b, ')');
  luaL_pushresult(&b);
  return lua_error(L);
}

static const struct cozy_retry_policy *find_or_raise(lua_State *L, const char *name) {
  const struct cozy_retry_policy *p = cozy_retry_policy_find(name);
  if (p == NULL) unknown_policy(L, name);
  return p;
}

/* The fields a policy table may set, where each goes, and its least value. */
static double *field_of(struct cozy_retry_policy *p, const char *k, double *min) {
  *min = 0;
  if (strcmp(k, "max_time") == 0) return &p->max_time;
  if (strcmp(k, "base_delay") == 0) return &p->backoff.base_delay;
  if (strcmp(k, "max_delay") == 0) return &p->backoff.max_delay;
  if (strcmp(k, "refused_time") == 0) return &p->refused_time;
  if (strcmp(k, "jitter") == 0) return &p->backoff.jitter;
  *min = 1;
  if (strcmp(k, "factor") == 0) return &p->backoff.factor;
  return NULL;
}

/* Sets p's fields from the table at idx (its `name` is the caller's);
** raises naming the policy and the field. */
static void apply_overrides(lua_State *L, int idx, struct cozy_retry_policy *p) {
  idx = lua_absindex(L, idx);
  lua_pushnil(L);
  while (lua_next(L, idx) != 0) {
    const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
    double min, v, *f;
    if (k == NULL) luaL_error(L, "retry policy '%s': a field name must be a string", p->name);
    if (strcmp(k, "name") == 0) {
      lua_pop(L, 1);
      continue;
    }
    if (lua_type(L, -1) != LUA_TNUMBER) luaL_error(L, "retry policy '%s': %s must be a number", p->name, k);
    v = lua_tonumber(L, -1);
    if (strcmp(k, "max_attempts") == 0) {
      if (!(v >= 1 && v <= INT_MAX))
        luaL_error(L, "retry policy '%s': max_attempts must be between 1 and %d", p->name, INT_MAX);
      p->max_attempts = (int)v;
    } else if ((f = field_of(p, k, &min)) != NULL) {
      if (!(v >= min)) luaL_error(L, "retry policy '%s': %s must be >= %d", p->name, k, (int)min);
      /* jitter past 2 would make a wait negative */
      if (strcmp(k, "jitter") == 0 && v > 2) luaL_error(L, "retry policy '%s': jitter must be <= 2", p->name);
      *f = v;
    } else {
      luaL_error(L,
                 "retry policy '%s': unknown field '%s' (max_attempts, max_time, base_delay, factor, "
                 "max_delay, jitter, refused_time)",
                 p->name, k);
    }
    lua_pop(L, 1);
  }
}

void cozy_retry_policy_read(lua_State *L, int idx, struct cozy_retry_policy *p) {
  idx = lua_absindex(L, idx);
  if (lua_type(L, idx) == LUA_TSTRING) {
    *p = *find_or_raise(L, lua_tostring(L, idx));
    return;
  }
  if (lua_type(L, idx) != LUA_TTABLE)
    luaL_error(L, "a retry policy must be a name or a table, not %s", luaL_typename(L, idx));
  lua_getfield(L, idx, "name");
  if (lua_isnil(L, -1)) *p = policies[0];
  else if (lua_type(L, -1) == LUA_TSTRING) *p = *find_or_raise(L, lua_tostring(L, -1));
  else luaL_error(L, "a retry policy's name must be a string, not %s", luaL_typename(L, -1));
  lua_pop(L, 1);
  apply_overrides(L, idx, p);
}

void cozy_retry_policy_push(lua_State *L, const struct cozy_retry_policy *p) {
  lua_createtable(L, 0, 8);
  lua_pushstring(L, p->name);
  lua_setfield(L, -2, "name");
  lua_pushinteger(L, p->max_attempts);
  lua_setfield(L, -2, "max_attempts");
  lua_pushnumber(L, p->max_time);
  lua_setfield(L, -2, "max_time");
  lua_pushnumber(L, p->backoff.base_delay);
  lua_setfield(L, -2, "base_delay");
  lua_pushnumber(L, p->backoff.factor);
  lua_setfield(L, -2, "factor");
  lua_pushnumber(L, p->backoff.max_delay);
  lua_setfield(L, -2, "max_delay");
  lua_pushnumber(L, p->backoff.jitter);
  lua_setfield(L, -2, "jitter");
  lua_pushnumber(L, p->refused_time);
  lua_setfield(L, -2, "refused_time");
}

/* transport.retry_policy(name [, overrides]) */
int cozy_lua_retry_policy(lua_State *L) {
  struct cozy_retry_policy p = *find_or_raise(L, luaL_checkstring(L, 1));
  if (!lua_isnoneornil(L, 2)) {
    luaL_checktype(L, 2, LUA_TTABLE);
    apply_overrides(L, 2, &p);
  }
  cozy_retry_policy_push(L, &p);
  return 1;
}

/* transport.backoff(policy, n [, u]) */
int cozy_lua_backoff(lua_State *L) {
  struct cozy_retry_policy p;
  lua_Integer n = luaL_checkinteger(L, 2);
  double u;
  if (n < 1) return luaL_error(L, "transport.backoff: the retry's number must be >= 1");
  if (n > INT_MAX) n = INT_MAX; /* past the cap long before */
  cozy_retry_policy_read(L, 1, &p);
  if (lua_isnoneornil(L, 3)) {
    /* Lua's generator: math.randomseed makes a Lua caller's waits repeatable */
    luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
    if (lua_getfield(L, -1, "math") != LUA_TTABLE || lua_getfield(L, -1, "random") != LUA_TFUNCTION)
      return luaL_error(L, "transport.backoff: no math.random to draw the jitter from");
    lua_call(L, 0, 1);
    u = lua_tonumber(L, -1);
  } else {
    u = luaL_checknumber(L, 3);
    if (!(u >= 0 && u < 1)) return luaL_error(L, "transport.backoff: u must be in [0, 1)");
  }
  lua_pushnumber(L, cozy_backoff_delay(&p.backoff, (int)n, u));
  return 1;
}
