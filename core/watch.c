/*
** proc.watch: stopping Lua code wherever it is, as lua.c's laction/lstop
** stop a script on ^C, but armed on purpose and with a deadline too.
**
**   local w <close> = proc.watch{ deadline = sys.monotime() + 300,
**                                 on_stop = function(reason, detail, where) error(...) end }
**
** Lua 5.4 traps every VM instruction of a thread that has a count hook,
** whatever the count (luaG_traceexec), so the main thread of the state that
** arms a watch on the process's main thread (the one signals reach) gets no
** hook until a stop is due, as in lua.c: the SIGTERM/SIGINT handler (after
** proc.trap()) and a timer set for the earliest deadline (SIGALRM, taken
** for the life of the process) set a count hook on it then (lua_sethook may
** be called from a signal handler); a due alarm fires again every 0.1 s
** until the watches move the timer. Once set, the hook checks every
** WATCH_COUNT instructions; when the stop holds it calls on_stop(reason,
** detail, where) and raises what it raises (if on_stop returns, a string
** error is raised); when nothing says stop any more it removes itself. As
** long as the condition holds and the watch is armed, the hook keeps firing,
** so a pcall cannot swallow the stop for good; w:close() (or leaving the
** <close> scope) disarms.
**
** A coroutine cannot be reached that way (a signal handler cannot know which
** thread runs), so threads other than the main one keep a count hook for as
** long as they may run under the watch: coroutines created while a watch is
** armed (coroutine.create and coroutine.wrap, as covered by
** cozy_watch_cover_coroutines, set it), one created earlier with
** w:attach(co), and a coroutine that arms a watch itself (its deadline moves
** the timer too). The same holds for a state whose watches the handlers
** cannot serve: the lease worker's (its thread blocks every signal), a
** second state, or any state when the timer cannot be made: there the
** arming thread is hooked at once, as before this was done on demand.
**
** Watches nest: the earliest deadline of the armed ones applies, and the
** watch owning it (or, for a signal, the innermost) has its on_stop called.
** C code that waits reads the same state through cozy_watches().
**
** The hook runs only between Lua instructions: never inside a C function,
** so C code holding a resource is never unwound by it. A C function that runs
** long (a pattern match, string.rep) is not interrupted; nor is a __gc
** metamethod (Lua runs finalizers with hooks off).
*/
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "lua.h"
#include "lauxlib.h"
#include "lualib.h"

#include "clock.h"
#include "signals.h"
#include "watch.h"

#define WATCH_MT "cozy.proc.watch"
#define WATCH_COUNT 1000 /* instructions between checks */
#define WATCH_SLICE 0.1 /* longest sleep between checks, seconds */
#define ALARM_REPEAT_NS 100000000L /* a due alarm fires again this often (0.1 s) */
#define ALARM_HORIZON 1e15 /* deadlines beyond this (math.huge) need no timer */

struct cozy_watch {
  struct cozy_watch *outer;
  struct cozy_watches *ws;
  double deadline; /* 0 = none */
  int armed;
};

/* What the signal handlers touch, as lua.c's laction touches its one
** lua_State: the thread a due stop hooks (the main thread of the state whose
** watches are armed on demand, or NULL), the POSIX thread that runs it, and
** the deadline timer. Set and cleared with the arming and closing of watches,
** and when that state closes. Only the process's main thread takes them
** (the lease worker's thread blocks every signal), so they are written by
** one thread only; alarm_target is published after the rest (release) and
** read first by the handlers (acquire). */
static _Atomic(lua_State *) alarm_target = NULL;
static pthread_t alarm_thread;
static timer_t deadline_timer;
static int timer_made = 0; /* 1 made, -1 cannot be made (watches hook at once) */

/* registry[&registry_key] = the state's struct cozy_watches (a userdata whose
** user value is a table lightuserdata(watch) -> handle: it keeps armed
** handles alive, so an armed watch is never collected). */
static const char registry_key = 'w';

struct cozy_watches *cozy_watches(lua_State *L) {
  struct cozy_watches *ws;
  lua_rawgetp(L, LUA_REGISTRYINDEX, &registry_key);
  ws = (struct cozy_watches *)lua_touserdata(L, -1);
  lua_pop(L, 1);
  return ws;
}

const char *cozy_stop_name(int reason) {
  return reason == COZY_STOP_SIGNAL  ? "signal"
      : reason == COZY_STOP_LOCK     ? "lock"
      : reason == COZY_STOP_ENDPOINT ? "endpoint"
                                     : "deadline";
}

/* What the armed watches say: the hook's and proc.pending_stop's view. */
static int poll_armed(const struct cozy_watches *ws, double now, double *detail) {
  int sig;
  if (ws == NULL || ws->top == NULL) return COZY_GO;
  sig = cozy_signals_caught();
  if (sig != 0) {
    *detail = sig;
    return COZY_STOP_SIGNAL;
  }
  if (ws->deadline > 0 && now >= ws->deadline) {
    *detail = now - ws->deadline;
    return COZY_STOP_DEADLINE;
  }
  return COZY_GO;
}

/* C code that waits or sends also stops, with no watch armed, on a signal
** its own thread trapped: the runner's stamp, lock and release requests. */
int cozy_watch_poll(const struct cozy_watches *ws, double now, double *detail) {
  int sig;
  if (ws != NULL && ws->top != NULL) return poll_armed(ws, now, detail);
  sig = cozy_signals_stop_pending();
  if (sig == 0) return COZY_GO;
  *detail = sig;
  return COZY_STOP_SIGNAL;
}

int cozy_watch_sleep(const struct cozy_watches *ws, double seconds, double *detail) {
  double now = cozy_monotime(), end = now + seconds;
  for (;;) {
    struct timespec ts;
    double slice;
    int r = cozy_watch_poll(ws, now, detail);
    if (r != COZY_GO) return r;
    slice = end - now;
    if (slice <= 0) return COZY_GO;
    /* a signal interrupts nanosleep in this thread; the slice bounds the
    ** delay when it lands in another thread or just before the call */
    if (slice > WATCH_SLICE) slice = WATCH_SLICE;
    if (ws != NULL && ws->top != NULL && ws->deadline > 0 && ws->deadline - now < slice)
      slice = ws->deadline - now + 1e-4;
    ts.tv_sec = (time_t)slice;
    ts.tv_nsec = (long)((slice - (double)ts.tv_sec) * 1e9);
    if (nanosleep(&ts, NULL) != 0 && errno != EINTR) return COZY_GO; /* EINVAL: cannot happen */
    now = cozy_monotime();
  }
}

/* The watch whose on_stop answers for `reason`. */
static struct cozy_watch *responsible(const struct cozy_watches *ws, int reason) {
  struct cozy_watch *w, *best = ws->top;
  if (reason != COZY_STOP_DEADLINE) return best;
  for (w = ws->top; w != NULL; w = w->outer) {
    if (w->deadline > 0 && w->deadline <= ws->deadline) return w;
  }
  return best;
}

int cozy_watch_raise(lua_State *L, int reason, double detail, int level) {
  struct cozy_watches *ws = cozy_watches(L);
  int where;
  luaL_where(L, level);
  where = lua_gettop(L);
  if (ws != NULL && ws->top != NULL) {
    struct cozy_watch *w = responsible(ws, reason);
    lua_rawgetp(L, LUA_REGISTRYINDEX, &registry_key);
    lua_getiuservalue(L, -1, 1);
    lua_rawgetp(L, -1, w); /* the handle */
    lua_getiuservalue(L, -1, 1); /* its on_stop */
    if (lua_isfunction(L, -1)) {
      size_t len;
      const char *pos = lua_tolstring(L, where, &len);
      lua_pushstring(L, cozy_stop_name(reason));
      if (reason == COZY_STOP_SIGNAL) lua_pushinteger(L, (lua_Integer)detail);
      else lua_pushnumber(L, detail);
      /* luaL_where gives "chunk:line: "; on_stop gets "chunk:line" */
      if (len >= 2) lua_pushlstring(L, pos, len - 2);
      else lua_pushnil(L);
      lua_call(L, 3, 0); /* expected to raise */
    }
    lua_settop(L, where);
  }
  if (reason == COZY_STOP_SIGNAL) lua_pushfstring(L, "interrupted by signal %d", (int)detail);
  else lua_pushliteral(L, "deadline exceeded");
  lua_concat(L, 2);
  return lua_error(L);
}

/* The hook of a thread under a watch. Set on demand on the main thread (by
** a due stop), it removes itself once nothing says stop; a handler may set
** it again between the two polls, and the second one sees it. Anywhere else
** (a coroutine, a state the handlers cannot serve) it stays while a watch is
** armed. */
static void watch_hook(lua_State *L, lua_Debug *ar) {
  struct cozy_watches *ws;
  double detail = 0;
  int r;
  (void)ar;
  ws = cozy_watches(L);
  r = poll_armed(ws, cozy_monotime(), &detail);
  if (r == COZY_GO && (ws == NULL || ws->top == NULL || ws->on_demand == L)) {
    lua_sethook(L, NULL, 0, 0);
    r = poll_armed(ws, cozy_monotime(), &detail);
    if (r == COZY_GO) return;
    lua_sethook(L, watch_hook, LUA_MASKCOUNT, WATCH_COUNT);
  }
  if (r != COZY_GO) cozy_watch_raise(L, r, detail, 0); /* level 0: the function running */
}

static void set_hook(lua_State *co) {
  lua_sethook(co, watch_hook, LUA_MASKCOUNT, WATCH_COUNT);
}

/* Async-signal-safe. A signal that lands in another thread (a resolver
** thread libcurl started) is sent on to the target's own: a hook is only
** set from the thread that runs it. */
/* The hook may also be lost to a race inside Lua (luaG_traceexec clears a
** frame's trap after reading the hook mask: a hook set in between is not
** seen by that frame), so a due alarm fires again every 0.1 s until the
** watches move the timer. */
void cozy_watch_alarm(int sig) {
  lua_State *target = atomic_load_explicit(&alarm_target, memory_order_acquire);
  struct itimerspec again;
  if (target == NULL) return;
  if (!pthread_equal(pthread_self(), alarm_thread)) {
    pthread_kill(alarm_thread, sig);
    return;
  }
  set_hook(target);
  memset(&again, 0, sizeof again);
  again.it_value.tv_nsec = again.it_interval.tv_nsec = ALARM_REPEAT_NS;
  timer_settime(deadline_timer, 0, &again, NULL);
}

static void on_alarm(int sig) {
  int saved = errno;
  cozy_watch_alarm(sig);
  errno = saved;
}

/* The deadline timer: on COZY_CLOCK (sys.monotime's), SIGALRM. */
static int make_timer(void) {
  struct sigaction sa;
  struct sigevent sev;
  if (timer_made != 0) return timer_made > 0;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_alarm;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  memset(&sev, 0, sizeof sev);
  sev.sigev_notify = SIGEV_SIGNAL;
  sev.sigev_signo = SIGALRM;
  if (sigaction(SIGALRM, &sa, NULL) != 0 || timer_create(COZY_CLOCK, &sev, &deadline_timer) != 0) {
    timer_made = -1;
    return 0;
  }
  timer_made = 1;
  return 1;
}

/* Sets the timer to fire at `deadline` (0: never), then every 0.1 s; 0 on
** failure. It is set a microsecond late, rounded up, so that the hook the
** alarm sets finds the deadline passed. */
static int arm_timer(double deadline) {
  struct itimerspec its;
  memset(&its, 0, sizeof its);
  if (deadline > 0 && deadline < ALARM_HORIZON) {
    double at = deadline + 1e-6;
    its.it_interval.tv_nsec = ALARM_REPEAT_NS;
    its.it_value.tv_sec = (time_t)at;
    its.it_value.tv_nsec = (long)((at - (double)its.it_value.tv_sec) * 1e9) + 1;
    if (its.it_value.tv_nsec >= 1000000000L) {
      its.it_value.tv_sec++;
      its.it_value.tv_nsec -= 1000000000L;
    }
  }
  return timer_settime(deadline_timer, TIMER_ABSTIME, &its, NULL) == 0;
}

/* Whether L's stops can be left to the handlers: L is its state's main
** thread, running on the process's main thread (the one signals reach), the
** state is not closing, and the timer and the handlers' one target are (or
** now become) this state's. */
static int take_alarm(lua_State *L, struct cozy_watches *ws) {
  int is_main;
  if (ws->on_demand == L) return 1;
  is_main = lua_pushthread(L);
  lua_pop(L, 1);
  if (!is_main || ws->closing || ws->on_demand != NULL || syscall(SYS_gettid) != getpid() ||
      atomic_load(&alarm_target) != NULL || !make_timer())
    return 0;
  ws->on_demand = L;
  alarm_thread = pthread_self();
  atomic_store_explicit(&alarm_target, L, memory_order_release);
  return 1;
}

static void release_alarm(struct cozy_watches *ws) {
  if (ws->on_demand == NULL) return;
  atomic_store(&alarm_target, NULL);
  ws->on_demand = NULL;
  arm_timer(0);
}

/* After the armed set changed: the timer follows the earliest deadline; if
** it cannot, the main thread is hooked now, as without a timer. */
static void follow_deadline(struct cozy_watches *ws) {
  lua_State *main_thread = ws->on_demand;
  if (main_thread == NULL) return;
  if (ws->top == NULL) {
    release_alarm(ws);
  } else if (!arm_timer(ws->deadline)) {
    /* no longer on demand, so that the hook does not remove itself */
    release_alarm(ws);
    set_hook(main_thread);
  }
}

/* The state's watches closing with it: nothing may point at it any more. */
static int watches_gc(lua_State *L) {
  struct cozy_watches *ws = (struct cozy_watches *)lua_touserdata(L, 1);
  ws->closing = 1; /* a later finalizer's proc.watch must not take the alarm */
  if (ws->on_demand != NULL) {
    release_alarm(ws);
    timer_delete(deadline_timer);
    timer_made = 0;
  }
  return 0;
}

/* The state's watches, created on first use (left on the stack: no). */
static struct cozy_watches *watches_for(lua_State *L) {
  struct cozy_watches *ws = cozy_watches(L);
  if (ws != NULL) return ws;
  ws = (struct cozy_watches *)lua_newuserdatauv(L, sizeof *ws, 1);
  ws->top = NULL;
  ws->deadline = 0;
  ws->on_demand = NULL;
  ws->closing = 0;
  lua_newtable(L);
  lua_setiuservalue(L, -2, 1);
  lua_newtable(L);
  lua_pushcfunction(L, watches_gc);
  lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, -2);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &registry_key);
  return ws;
}

static void recompute(struct cozy_watches *ws) {
  struct cozy_watch *w;
  ws->deadline = 0;
  for (w = ws->top; w != NULL; w = w->outer) {
    if (w->deadline > 0 && (ws->deadline == 0 || w->deadline < ws->deadline)) ws->deadline = w->deadline;
  }
}

/* proc.watch{ deadline = monotime or nil, on_stop = function or nil } -> handle */
int cozy_proc_watch(lua_State *L) {
  struct cozy_watches *ws;
  struct cozy_watch *w;
  double deadline = 0, detail = 0;
  int on_demand;
  if (!lua_isnoneornil(L, 1)) luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  if (lua_istable(L, 1)) {
    lua_getfield(L, 1, "deadline");
    if (!lua_isnil(L, -1)) {
      if (lua_type(L, -1) != LUA_TNUMBER)
        return luaL_error(L, "watch: 'deadline' must be a number (a sys.monotime() value)");
      deadline = lua_tonumber(L, -1);
      if (!(deadline > 0)) return luaL_error(L, "watch: 'deadline' must be a positive sys.monotime() value");
    }
    lua_getfield(L, 1, "on_stop");
    if (!lua_isnil(L, -1) && !lua_isfunction(L, -1))
      return luaL_error(L, "watch: 'on_stop' must be a function");
  } else {
    lua_pushnil(L);
    lua_pushnil(L);
  }
  /* stack: opts, deadline, on_stop */
  ws = watches_for(L);
  w = (struct cozy_watch *)lua_newuserdatauv(L, sizeof *w, 1);
  w->outer = ws->top;
  w->ws = ws;
  w->deadline = deadline;
  w->armed = 1;
  luaL_setmetatable(L, WATCH_MT);
  lua_pushvalue(L, 3);
  lua_setiuservalue(L, -2, 1);
  /* anchor it, then link it */
  lua_rawgetp(L, LUA_REGISTRYINDEX, &registry_key);
  lua_getiuservalue(L, -1, 1);
  lua_pushvalue(L, -3);
  lua_rawsetp(L, -2, w);
  lua_pop(L, 2);
  ws->top = w;
  recompute(ws);
  on_demand = take_alarm(L, ws);
  if (!on_demand) set_hook(L);
  follow_deadline(ws); /* also when armed in a coroutine: its deadline may be the earliest */
  /* a signal caught before, or a deadline already passed */
  if (on_demand && poll_armed(ws, cozy_monotime(), &detail) != COZY_GO) set_hook(L);
  return 1;
}

static int watch_close(lua_State *L) {
  struct cozy_watch *w = (struct cozy_watch *)luaL_checkudata(L, 1, WATCH_MT);
  struct cozy_watches *ws = w->ws;
  struct cozy_watch **p;
  if (!w->armed) return 0;
  w->armed = 0;
  for (p = &ws->top; *p != NULL; p = &(*p)->outer) {
    if (*p == w) {
      *p = w->outer;
      break;
    }
  }
  recompute(ws);
  follow_deadline(ws);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &registry_key);
  lua_getiuservalue(L, -1, 1);
  lua_pushnil(L);
  lua_rawsetp(L, -2, w);
  lua_pop(L, 2);
  /* coroutines keep their hook; with nothing armed it does nothing */
  if (ws->top == NULL && lua_gethook(L) == watch_hook) lua_sethook(L, NULL, 0, 0);
  return 0;
}

/* w:attach(co): covers a coroutine created before the watch was armed. */
static int watch_attach(lua_State *L) {
  struct cozy_watch *w = (struct cozy_watch *)luaL_checkudata(L, 1, WATCH_MT);
  lua_State *co = lua_tothread(L, 2);
  luaL_argexpected(L, co != NULL, 2, "coroutine");
  if (w->armed) set_hook(co);
  return 0;
}

/* w:armed() -> boolean */
static int watch_armed(lua_State *L) {
  struct cozy_watch *w = (struct cozy_watch *)luaL_checkudata(L, 1, WATCH_MT);
  lua_pushboolean(L, w->armed);
  return 1;
}

/* proc.pending_stop() -> reason, detail when an armed watch says stop, else nil.
** For code that catches errors (a pcall wrapper): rethrow when this is set. */
int cozy_proc_pending_stop(lua_State *L) {
  double detail = 0;
  int r = poll_armed(cozy_watches(L), cozy_monotime(), &detail);
  if (r == COZY_GO) {
    lua_pushnil(L);
    return 1;
  }
  lua_pushstring(L, cozy_stop_name(r));
  if (r == COZY_STOP_SIGNAL) lua_pushinteger(L, (lua_Integer)detail);
  else lua_pushnumber(L, detail);
  return 2;
}

/* coroutine.create and coroutine.wrap (upvalue 1: Lua's own): the same, and
** a coroutine created while a watch is armed gets the count hook. */
static int covered_start(lua_State *L) {
  const struct cozy_watches *ws;
  lua_State *co;
  luaL_checktype(L, 1, LUA_TFUNCTION);
  lua_settop(L, 1);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, 1, 1);
  ws = cozy_watches(L);
  if (ws == NULL || ws->top == NULL) return 1;
  co = lua_tothread(L, -1);
  if (co == NULL && lua_getupvalue(L, -1, 1) != NULL) { /* wrap's function holds its coroutine */
    co = lua_tothread(L, -1);
    lua_pop(L, 1);
  }
  if (co != NULL) set_hook(co);
  return 1;
}

void cozy_watch_cover_coroutines(lua_State *L) {
  static const char *const starts[] = {"create", "wrap"};
  size_t i;
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
  lua_getfield(L, -1, LUA_COLIBNAME);
  for (i = 0; i < sizeof starts / sizeof starts[0]; i++) {
    lua_getfield(L, -1, starts[i]);
    lua_pushcclosure(L, covered_start, 1);
    lua_setfield(L, -2, starts[i]);
  }
  lua_pop(L, 2);
}

static const luaL_Reg watch_methods[] = {
    {"close", watch_close}, {"attach", watch_attach}, {"armed", watch_armed}, {NULL, NULL}};

void cozy_watch_open(lua_State *L) {
  if (luaL_newmetatable(L, WATCH_MT)) {
    luaL_newlib(L, watch_methods);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, watch_close);
    lua_setfield(L, -2, "__close");
  }
  lua_pop(L, 1);
}
