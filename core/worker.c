/*
** cozy.worker: a background thread running its own Lua state, for work that
** must go on while the main state is busy in a migration (renewing the
** lock's Lease). Lua states are not shared: the thread gets a fresh state
** from cozy_host_open, a module name, a function name and one string
** (plain data, e.g. JSON connect options). The two sides share only a small
** mutex-protected record: "stop" (main -> worker), "lost" with a message
** and the monotonic time of the last success (worker -> main).
**
**   main:   local w = worker.start("cozy.runner.lease", "renew_loop", payload)
**           w:lost() -> message or nil;  w:last_ok() -> monotime or nil
**           w:stop() -> true, or nil and the worker's error (joins the thread)
**   worker: module[func](payload, chan)
**           chan:wait(seconds) -> true when stop was asked (returns early)
**           chan:ok([t])       -- record a success at monotime t (default now)
**           chan:lost(message) -- tell main the work failed for good
*/
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lua.h"
#include "lauxlib.h"
#include "lualib.h"

#include "clock.h"
#include "heap.h"
#include "host.h"

#define WORKER_MT "cozy.worker"
#define CHANNEL_MT "cozy.worker.channel"

struct shared {
  pthread_mutex_t mu;
  pthread_cond_t cv; /* signalled when stop is set */
  int refs; /* main handle + thread */
  int stop;
  int lost;
  double last_ok; /* cozy_monotime() seconds, 0 = never */
  char message[512]; /* lost message, or the worker's error */
  int failed; /* the worker function raised */
  char *module, *func, *payload;
};

struct worker {
  struct shared *sh;
  pthread_t thread;
  int running;
};

static void shared_release(struct shared *sh) {
  int last;
  pthread_mutex_lock(&sh->mu);
  last = --sh->refs == 0;
  pthread_mutex_unlock(&sh->mu);
  if (!last) return;
  pthread_mutex_destroy(&sh->mu);
  pthread_cond_destroy(&sh->cv);
  free(sh->module);
  free(sh->func);
  free(sh->payload);
  free(sh);
}

/* The mutex, and a condition variable whose timed waits use COZY_CLOCK
** (the default, CLOCK_REALTIME, moves with NTP steps and `date -s`).
** 0 or an errno value; nothing to destroy on failure. */
static int init_sync(struct shared *sh) {
  pthread_condattr_t attr;
  int rc = pthread_condattr_init(&attr);
  if (rc != 0) return rc;
  rc = pthread_condattr_setclock(&attr, COZY_CLOCK);
  if (rc == 0) rc = pthread_cond_init(&sh->cv, &attr);
  pthread_condattr_destroy(&attr);
  if (rc != 0) return rc;
  rc = pthread_mutex_init(&sh->mu, NULL);
  if (rc != 0) pthread_cond_destroy(&sh->cv);
  return rc;
}

static void set_message(struct shared *sh, const char *msg) {
  strncpy(sh->message, msg ? msg : "", sizeof sh->message - 1);
  sh->message[sizeof sh->message - 1] = '\0';
}

/* ---- worker side ---- */

static struct shared *check_channel(lua_State *L) {
  return *(struct shared **)luaL_checkudata(L, 1, CHANNEL_MT);
}

static int chan_wait(lua_State *L) {
  struct shared *sh = check_channel(L);
  lua_Number s = luaL_checknumber(L, 2);
  struct timespec deadline;
  int stop;
  /* the condition variable waits on COZY_CLOCK (init_sync): a wall-clock
  ** step must not stall or hurry renewals */
  deadline = cozy_monotime_after(s);
  pthread_mutex_lock(&sh->mu);
  while (!sh->stop && s > 0) {
    if (pthread_cond_timedwait(&sh->cv, &sh->mu, &deadline) == ETIMEDOUT) break;
  }
  stop = sh->stop;
  pthread_mutex_unlock(&sh->mu);
  lua_pushboolean(L, stop);
  return 1;
}

/* chan:ok([t]): a success at monotonic time t (default now). A lease
** renewal counts from before it was sent, not from its answer; the record
** never moves back. */
static int chan_ok(lua_State *L) {
  struct shared *sh = check_channel(L);
  double t = (double)luaL_optnumber(L, 2, (lua_Number)cozy_monotime());
  pthread_mutex_lock(&sh->mu);
  if (t > sh->last_ok) sh->last_ok = t;
  pthread_mutex_unlock(&sh->mu);
  return 0;
}

static int chan_lost(lua_State *L) {
  struct shared *sh = check_channel(L);
  const char *msg = luaL_optstring(L, 2, "lost");
  pthread_mutex_lock(&sh->mu);
  if (!sh->lost) set_message(sh, msg);
  sh->lost = 1;
  pthread_mutex_unlock(&sh->mu);
  return 0;
}

static const luaL_Reg channel_methods[] = {
    {"wait", chan_wait}, {"ok", chan_ok}, {"lost", chan_lost}, {NULL, NULL}};

static int worker_pmain(lua_State *L) {
  struct shared *sh = (struct shared *)lua_touserdata(L, 1);
  struct shared **ud;
  cozy_host_open(L);
  lua_getglobal(L, "require");
  lua_pushstring(L, sh->module);
  lua_call(L, 1, 1);
  lua_getfield(L, -1, sh->func);
  lua_pushstring(L, sh->payload);
  ud = (struct shared **)lua_newuserdatauv(L, sizeof *ud, 0);
  *ud = sh;
  if (luaL_newmetatable(L, CHANNEL_MT)) {
    luaL_newlib(L, channel_methods);
    lua_setfield(L, -2, "__index");
  }
  lua_setmetatable(L, -2);
  lua_call(L, 2, 0);
  return 0;
}

static void *worker_main(void *arg) {
  struct shared *sh = (struct shared *)arg;
  lua_State *L;
  /* signals are blocked here from the start (worker_start): they are the
  ** main thread's, whose waits they interrupt */
  L = cozy_state_new();
  if (L == NULL) {
    pthread_mutex_lock(&sh->mu);
    sh->failed = 1;
    set_message(sh, "cannot create state: not enough memory");
    pthread_mutex_unlock(&sh->mu);
  } else {
    lua_pushcfunction(L, worker_pmain);
    lua_pushlightuserdata(L, sh);
    if (cozy_host_pcall(L, 1, 0) != LUA_OK) {
      pthread_mutex_lock(&sh->mu);
      sh->failed = 1;
      set_message(sh, lua_tostring(L, -1));
      pthread_mutex_unlock(&sh->mu);
    }
    cozy_state_close(L);
  }
  shared_release(sh);
  return NULL;
}

/* ---- main side ---- */

static struct worker *check_worker(lua_State *L) {
  return (struct worker *)luaL_checkudata(L, 1, WORKER_MT);
}

static char *dup_string(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

static int worker_start(lua_State *L) {
  const char *module = luaL_checkstring(L, 1);
  const char *func = luaL_checkstring(L, 2);
  const char *payload = luaL_optstring(L, 3, "");
  struct worker *w = (struct worker *)lua_newuserdatauv(L, sizeof *w, 0);
  struct shared *sh;
  sigset_t all, old;
  int rc, mask_rc;
  w->sh = NULL;
  w->running = 0;
  luaL_setmetatable(L, WORKER_MT);
  sh = (struct shared *)calloc(1, sizeof *sh);
  if (sh == NULL) return luaL_error(L, "not enough memory");
  rc = init_sync(sh);
  if (rc != 0) {
    free(sh);
    return luaL_error(L, "cannot set up the worker: %s", strerror(rc));
  }
  sh->refs = 1;
  sh->module = dup_string(module);
  sh->func = dup_string(func);
  sh->payload = dup_string(payload);
  w->sh = sh;
  if (!sh->module || !sh->func || !sh->payload) return luaL_error(L, "not enough memory");
  sh->refs = 2;
  /* The thread inherits the mask it is created with: blocking every signal
  ** inside the thread instead would leave a window in which a SIGTERM meant
  ** for the main thread (waking its sleep or transfer) lands in the worker. */
  sigfillset(&all);
  rc = pthread_sigmask(SIG_BLOCK, &all, &old);
  if (rc != 0) {
    sh->refs = 1;
    return luaL_error(L, "pthread_sigmask: %s", strerror(rc));
  }
  rc = pthread_create(&w->thread, NULL, worker_main, sh);
  mask_rc = pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) {
    sh->refs = 1;
    return luaL_error(L, "pthread_create: %s", strerror(rc));
  }
  w->running = 1;
  /* the main thread would be left deaf to signals; __gc stops the worker */
  if (mask_rc != 0) return luaL_error(L, "pthread_sigmask: %s", strerror(mask_rc));
  return 1;
}

static void worker_join(struct worker *w) {
  if (!w->running) return;
  pthread_mutex_lock(&w->sh->mu);
  w->sh->stop = 1;
  pthread_cond_broadcast(&w->sh->cv);
  pthread_mutex_unlock(&w->sh->mu);
  pthread_join(w->thread, NULL);
  w->running = 0;
}

static int worker_stop(lua_State *L) {
  struct worker *w = check_worker(L);
  int failed;
  if (w->sh == NULL) return luaL_error(L, "worker not started");
  worker_join(w);
  pthread_mutex_lock(&w->sh->mu);
  failed = w->sh->failed;
  if (failed) {
    lua_pushnil(L);
    lua_pushstring(L, w->sh->message);
  }
  pthread_mutex_unlock(&w->sh->mu);
  if (failed) return 2;
  lua_pushboolean(L, 1);
  return 1;
}

/* The lost message, or the worker's error if it died: either way the work
** no longer goes on. nil while all is well. */
static int worker_lost(lua_State *L) {
  struct worker *w = check_worker(L);
  int n = 0;
  if (w->sh == NULL) return 0;
  pthread_mutex_lock(&w->sh->mu);
  if (w->sh->lost || w->sh->failed) {
    lua_pushstring(L, w->sh->message);
    n = 1;
  }
  pthread_mutex_unlock(&w->sh->mu);
  if (n == 0) lua_pushnil(L);
  return 1;
}

static int worker_last_ok(lua_State *L) {
  struct worker *w = check_worker(L);
  double t = 0;
  if (w->sh != NULL) {
    pthread_mutex_lock(&w->sh->mu);
    t = w->sh->last_ok;
    pthread_mutex_unlock(&w->sh->mu);
  }
  if (t == 0) lua_pushnil(L);
  else lua_pushnumber(L, (lua_Number)t);
  return 1;
}

static int worker_gc(lua_State *L) {
  struct worker *w = check_worker(L);
  if (w->sh == NULL) return 0;
  worker_join(w);
  shared_release(w->sh);
  w->sh = NULL;
  return 0;
}

static const luaL_Reg worker_methods[] = {
    {"stop", worker_stop}, {"lost", worker_lost}, {"last_ok", worker_last_ok}, {NULL, NULL}};

static const luaL_Reg worker_funcs[] = {{"start", worker_start}, {NULL, NULL}};

int luaopen_cozy_worker(lua_State *L) {
  if (luaL_newmetatable(L, WORKER_MT)) {
    luaL_newlib(L, worker_methods);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, worker_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, worker_gc);
    lua_setfield(L, -2, "__close");
  }
  lua_pop(L, 1);
  luaL_newlib(L, worker_funcs);
  return 1;
}
