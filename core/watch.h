/* Watches: what stops a run wherever it is (core/watch.c). A watch, armed by
** proc.watch{} in one Lua state, says "stop on SIGTERM/SIGINT, or once this
** monotonic deadline has passed". Lua code is stopped by a count hook: on
** the main thread of the process's primary state it is set only once a stop
** is due (by the signal handlers); coroutines under a watch, and any other
** state or thread, have it from the start. C code that waits (the transport,
** sys.sleep) asks cozy_watch_poll and sleeps with cozy_watch_sleep.
** Process-wide: the signal flag, SIGALRM, and what the handlers need to reach
** the one state whose main thread is watched on demand. */
#ifndef COZY_WATCH_H
#define COZY_WATCH_H

#include "lua.h"

enum cozy_stop {
  COZY_GO = 0, /* nothing says stop */
  COZY_STOP_SIGNAL = 1, /* detail: the signal number */
  COZY_STOP_DEADLINE = 2, /* detail: seconds past the deadline */
  COZY_STOP_LOCK = 3, /* a child's group only (proc.spawn): the lock may no longer be ours */
  COZY_STOP_ENDPOINT = 4 /* a child's group only: its endpoint's serve asked it stopped */
};

struct cozy_watch;

/* The watches of one Lua state (all its threads): the armed ones, innermost
** first, and the earliest of their deadlines. */
struct cozy_watches {
  struct cozy_watch *top;
  double deadline; /* CLOCK_MONOTONIC seconds; 0 = none */
  lua_State *on_demand; /* the main thread, hooked only once a stop is due; or NULL */
  int closing; /* the state is closing: no more alarms */
};

/* The state's watches, or NULL when proc.watch was never called in it. */
struct cozy_watches *cozy_watches(lua_State *L);
/* COZY_GO unless an armed watch says stop at `now`; *detail as above. With
** no watch armed, a signal trapped by this thread still says stop
** (cozy_signals_stop_pending): the runner's own requests and waits end. */
int cozy_watch_poll(const struct cozy_watches *ws, double now, double *detail);
/* Sleeps `seconds`, returning early (with the reason) when a watch says stop.
** Without an armed watch only a signal this thread trapped ends it early. */
int cozy_watch_sleep(const struct cozy_watches *ws, double seconds, double *detail);
/* Calls the responsible watch's on_stop(reason, detail, where) and raises its
** error, or "interrupted by signal N" / "deadline exceeded". `level` is the
** stack level whose position is `where` (1 from a C function). Never returns. */
int cozy_watch_raise(lua_State *L, int reason, double detail, int level);
const char *cozy_stop_name(int reason); /* "signal", "deadline", "lock", "endpoint" */

/* From a signal handler (async-signal-safe): a stop may be due, hook the
** watched main thread. SIGALRM (the deadline timer) is handled in watch.c;
** core/signals.c calls it for SIGTERM/SIGINT. */
void cozy_watch_alarm(int sig);
/* Replaces coroutine.create and coroutine.wrap of a fresh state with
** versions that give a coroutine created under an armed watch its hook. */
void cozy_watch_cover_coroutines(lua_State *L);

/* cozy.proc functions (core/watch.c) */
int cozy_proc_watch(lua_State *L);
int cozy_proc_pending_stop(lua_State *L);
void cozy_watch_open(lua_State *L); /* the handle's metatable */

#endif
