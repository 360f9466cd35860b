/*
** cozy.proc: child processes and signals for the runner.
** - spawn: runs a legacy migration script with a given environment and hands
**   each line it writes (stdout and stderr) to a Lua callback, so its output
**   becomes log lines as it happens, not after it exits.
** - trap/signalled: SIGTERM and SIGINT only set a flag; the runner polls it
**   at safe points (between steps, before each write), so a step is never
**   left half stamped. The flag is the one process-wide mutable value, as
**   a signal handler can touch nothing else safely.
** - watch/pending_stop (core/watch.c): under an armed watch the flag, or a
**   deadline, also stops Lua code that never writes and the transport's waits.
*/
#define _GNU_SOURCE /* pipe2 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lua.h"
#include "lauxlib.h"

#include "host.h"
#include "watch.h"

static volatile sig_atomic_t caught_signal = 0;

static void on_signal(int sig) {
  int saved = errno;
  caught_signal = sig;
  cozy_watch_alarm(sig);
  errno = saved;
}

/* For the watches (core/watch.c): what stops Lua code and the transport. */
int cozy_caught_signal(void) {
  return caught_signal;
}

/* proc.trap(): from now on SIGTERM and SIGINT set the flag instead of
** killing the process. */
static int proc_trap(lua_State *L) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGTERM, &sa, NULL) != 0 || sigaction(SIGINT, &sa, NULL) != 0)
    return luaL_error(L, "sigaction: %s", strerror(errno));
  return 0;
}

/* proc.signalled() -> signal number caught since the last reset, or nil */
static int proc_signalled(lua_State *L) {
  if (caught_signal == 0) lua_pushnil(L);
  else lua_pushinteger(L, caught_signal);
  return 1;
}

static int proc_reset_signal(lua_State *L) {
  (void)L;
  caught_signal = 0;
  return 0;
}

/* proc.kill(pid, sig): for tests and for forwarding; true or nil, err */
static int proc_kill(lua_State *L) {
  pid_t pid = (pid_t)luaL_checkinteger(L, 1);
  int sig = (int)luaL_optinteger(L, 2, SIGTERM);
  if (kill(pid, sig) != 0) {
    lua_pushnil(L);
    lua_pushstring(L, strerror(errno));
    return 2;
  }
  lua_pushboolean(L, 1);
  return 1;
}

static int proc_isatty(lua_State *L) {
  lua_pushboolean(L, isatty((int)luaL_checkinteger(L, 1)));
  return 1;
}

/* A NULL-terminated array of strings from the Lua array at idx, kept alive
** as a userdata on the stack (freed by the GC, even if an error is raised). */
static char **string_array(lua_State *L, int idx, const char *what) {
  lua_Integer n = luaL_len(L, idx), i;
  char **v = (char **)lua_newuserdatauv(L, sizeof(char *) * (size_t)(n + 1), 0);
  for (i = 1; i <= n; i++) {
    lua_geti(L, idx, i);
    if (lua_type(L, -1) != LUA_TSTRING) luaL_error(L, "%s[%d] is not a string", what, (int)i);
    v[i - 1] = (char *)lua_tostring(L, -1);
    /* the string stays referenced by the table at idx */
    lua_pop(L, 1);
  }
  v[n] = NULL;
  return v;
}

struct line_buffer {
  luaL_Buffer b;
  int open;
  const char *name;
};

struct line {
  const char *name, *s;
  size_t len;
};

/* Runs protected: pushes the line's strings (which allocate, so may raise)
** and calls on_line(name, line). */
static int call_on_line(lua_State *L) {
  const struct line *ln = lua_touserdata(L, 2);
  lua_pushvalue(L, 1);
  lua_pushstring(L, ln->name);
  lua_pushlstring(L, ln->s, ln->len);
  lua_call(L, 2, 0);
  return 0;
}

/* Calls on_line(name, line) protected; the first error is kept at errslot.
** Only non-allocating pushes happen outside the protected call, so nothing
** here raises past proc_spawn's buffers, pipes and child. */
static void emit_line(lua_State *L, int cb, int errslot, const char *name, const char *s, size_t len) {
  struct line ln;
  ln.name = name;
  ln.s = s;
  ln.len = len;
  if (!lua_checkstack(L, 5)) return; /* cannot happen: spawn uses a few slots */
  lua_pushcfunction(L, call_on_line);
  lua_pushvalue(L, cb);
  lua_pushlightuserdata(L, &ln);
  if (lua_pcall(L, 2, 0, 0) != LUA_OK) {
    if (lua_isnil(L, errslot)) lua_replace(L, errslot);
    else lua_pop(L, 1);
  }
}

/*
** proc.spawn(argv, env, on_line [, opts]) -> how, code
** argv: { path, args... }; env: array of "K=V" (nil: inherit ours);
** on_line(stream, line) with stream "stdout" or "stderr".
** opts.cwd: the child's working directory (a legacy script runs from its
** own directory); argv[1] is then made absolute first, so a relative path
** still names the same file and the script's $0 is a full path.
** how is "exit" (code = status) or "signal" (code = signal number).
** If the runner's signal flag is set while the child runs, the signal is
** forwarded to the child once (a deleted Job's pod gets SIGTERM; the
** script should see it too). A partial last line is delivered at EOF.
*/
/* The absolute form of path, kept alive as a userdata-backed string on the
** stack (realpath's malloc'd result is copied, then freed). */
static const char *absolute(lua_State *L, const char *path) {
  char *r = realpath(path, NULL);
  if (r == NULL) luaL_error(L, "%s: %s", path, strerror(errno));
  lua_pushstring(L, r);
  free(r);
  return lua_tostring(L, -1);
}

static int proc_spawn(lua_State *L) {
  char **argv, **envp = NULL;
  const char *cwd = NULL;
  int out[2], err[2], exec_err[2], status, forwarded = 0, i, errslot, cb;
  pid_t pid;
  struct pollfd pfd[2];
  char *pending[2] = {NULL, NULL};
  size_t pending_len[2] = {0, 0};
  const char *names[2] = {"stdout", "stderr"};
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_checktype(L, 3, LUA_TFUNCTION);
  if (!lua_isnoneornil(L, 4)) luaL_checktype(L, 4, LUA_TTABLE);
  lua_settop(L, 4); /* what follows is pushed above the arguments */
  argv = string_array(L, 1, "argv");
  if (argv[0] == NULL) return luaL_argerror(L, 1, "empty argv");
  if (!lua_isnoneornil(L, 2)) {
    luaL_checktype(L, 2, LUA_TTABLE);
    envp = string_array(L, 2, "env");
  }
  if (!lua_isnil(L, 4)) {
    if (lua_getfield(L, 4, "cwd") != LUA_TNIL) {
      cwd = absolute(L, luaL_checkstring(L, -1));
      argv[0] = (char *)absolute(L, argv[0]);
    } else {
      lua_pop(L, 1);
    }
  }
  cb = 3;
  lua_pushnil(L);
  errslot = lua_gettop(L);
  if (pipe2(out, O_CLOEXEC) != 0) return luaL_error(L, "pipe: %s", strerror(errno));
  if (pipe2(err, O_CLOEXEC) != 0) {
    close(out[0]);
    close(out[1]);
    return luaL_error(L, "pipe: %s", strerror(errno));
  }
  /* exec_err: the child writes exec's errno here; a successful exec closes
  ** it (O_CLOEXEC), so the parent reads either an errno or end of file. */
  if (pipe2(exec_err, O_CLOEXEC) != 0) {
    close(out[0]);
    close(out[1]);
    close(err[0]);
    close(err[1]);
    return luaL_error(L, "pipe: %s", strerror(errno));
  }
  pid = fork();
  if (pid < 0) {
    close(out[0]);
    close(out[1]);
    close(err[0]);
    close(err[1]);
    close(exec_err[0]);
    close(exec_err[1]);
    return luaL_error(L, "fork: %s", strerror(errno));
  }
  if (pid == 0) {
    /* child: only async-signal-safe calls until exec */
    sigset_t none;
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    signal(SIGALRM, SIG_DFL);
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    dup2(out[1], 1);
    dup2(err[1], 2);
    i = open("/dev/null", O_RDONLY);
    if (i >= 0) {
      dup2(i, 0);
      if (i > 2) close(i);
    }
    {
      /* strerror is not async-signal-safe (locale, a static buffer): the
      ** child reports which call failed and its errno; the parent formats */
      int report[2] = {0, 0};
      ssize_t w;
      if (cwd != NULL && chdir(cwd) != 0) {
        report[0] = 1;
      } else {
        if (envp) execve(argv[0], argv, envp);
        else execv(argv[0], argv);
      }
      report[1] = errno;
      w = write(exec_err[1], report, sizeof report);
      (void)w;
    }
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  close(exec_err[1]);
  {
    int report[2] = {0, 0};
    ssize_t n;
    while ((n = read(exec_err[0], report, sizeof report)) < 0 && errno == EINTR) {}
    close(exec_err[0]);
    if (n == (ssize_t)sizeof report) {
      /* reported as the child's own stderr line; it exits 127, as a shell's */
      char msg[512];
      int len = report[0] == 1
          ? snprintf(msg, sizeof msg, "chdir failed: %s: %s", cwd, strerror(report[1]))
          : snprintf(msg, sizeof msg, "exec failed: %s: %s", argv[0], strerror(report[1]));
      if (len < 0) len = 0;
      if ((size_t)len >= sizeof msg) len = (int)sizeof msg - 1;
      emit_line(L, cb, errslot, names[1], msg, (size_t)len);
    }
  }
  pfd[0].fd = out[0];
  pfd[1].fd = err[0];
  pfd[0].events = pfd[1].events = POLLIN;
  while (pfd[0].fd >= 0 || pfd[1].fd >= 0) {
    int r = poll(pfd, 2, 200);
    if (caught_signal && !forwarded) {
      kill(pid, caught_signal);
      forwarded = 1;
    }
    if (r < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (i = 0; i < 2; i++) {
      char buf[4096];
      ssize_t n;
      if (pfd[i].fd < 0 || !(pfd[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      n = read(pfd[i].fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        if (pending_len[i] > 0) emit_line(L, cb, errslot, names[i], pending[i], pending_len[i]);
        pending_len[i] = 0;
        close(pfd[i].fd);
        pfd[i].fd = -1;
        continue;
      }
      {
        /* append, then emit every complete line */
        char *grown = realloc(pending[i], pending_len[i] + (size_t)n);
        size_t start = 0, j;
        if (grown == NULL) continue;
        pending[i] = grown;
        memcpy(pending[i] + pending_len[i], buf, (size_t)n);
        pending_len[i] += (size_t)n;
        for (j = 0; j < pending_len[i]; j++) {
          if (pending[i][j] == '\n') {
            emit_line(L, cb, errslot, names[i], pending[i] + start, j - start);
            start = j + 1;
          }
        }
        memmove(pending[i], pending[i] + start, pending_len[i] - start);
        pending_len[i] -= start;
      }
    }
  }
  free(pending[0]);
  free(pending[1]);
  if (pfd[0].fd >= 0) close(pfd[0].fd);
  if (pfd[1].fd >= 0) close(pfd[1].fd);
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return luaL_error(L, "waitpid: %s", strerror(errno));
    if (caught_signal && !forwarded) {
      kill(pid, caught_signal);
      forwarded = 1;
    }
  }
  if (!lua_isnil(L, errslot)) return lua_error(L); /* the callback's error */
  if (WIFSIGNALED(status)) {
    lua_pushliteral(L, "signal");
    lua_pushinteger(L, WTERMSIG(status));
  } else {
    lua_pushliteral(L, "exit");
    lua_pushinteger(L, WEXITSTATUS(status));
  }
  return 2;
}

static const luaL_Reg proc_funcs[] = {{"trap", proc_trap},
                                      {"signalled", proc_signalled},
                                      {"reset_signal", proc_reset_signal},
                                      {"kill", proc_kill},
                                      {"isatty", proc_isatty},
                                      {"spawn", proc_spawn},
                                      {"watch", cozy_proc_watch},
                                      {"pending_stop", cozy_proc_pending_stop},
                                      {NULL, NULL}};

int luaopen_cozy_proc(lua_State *L) {
  cozy_watch_open(L);
  luaL_newlib(L, proc_funcs);
  return 1;
}
