/*
** cozy.proc: child processes and signals for the runner.
** - spawn: runs a legacy migration script in its own process group with a
**   given environment and hands each line it writes (stdout and stderr) to
**   a Lua callback, so its output becomes log lines as it happens. The
**   group is stopped (SIGTERM, then SIGKILL after a grace) on the step's
**   deadline, on the runner's SIGTERM/SIGINT/SIGHUP, before the lock may
**   stop being ours, and once the script exits: a background child it left
**   cannot hold the runner (and the lock). A guardian process
**   (core/guardian.c) kills the group and removes the script's kubeconfig
**   when the runner dies, SIGKILL included, or is frozen past those times.
** - spawn with opts.endpoint: the script runs in a network namespace of
**   its own whose only address is the engine's endpoint (core/endpoint.c),
**   served by the runner while the script runs; no namespace, no run.
** - trap/signalled: the stop flag of core/signals.c, for the runner's safe
**   points (between steps, before each write).
** - watch/pending_stop (core/watch.c): under an armed watch the flag, or a
**   deadline, also stops Lua code that never writes and the transport's waits.
*/
#define _GNU_SOURCE /* pipe2, dup3, close_range */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <linux/capability.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lua.h"
#include "lauxlib.h"

#include "clock.h"
#include "endpoint.h"
#include "guardian.h"
#include "host.h"
#include "proc.h"
#include "signals.h"
#include "watch.h"

/* proc.trap(): from now on SIGTERM and SIGINT set the flag instead of
** killing the process. */
static int proc_trap(lua_State *L) {
  int rc = cozy_signals_trap();
  if (rc != 0) return luaL_error(L, "sigaction: %s", strerror(rc));
  return 0;
}

/* proc.signalled() -> signal number caught since the last reset, or nil */
static int proc_signalled(lua_State *L) {
  int sig = cozy_signals_caught();
  if (sig == 0) lua_pushnil(L);
  else lua_pushinteger(L, sig);
  return 1;
}

/* proc.reset_signal([sig]): clears the flag; with sig, sets it back to a
** signal caught earlier unless another has come since (a step's finally
** runs with the flag cleared; the stop it answered still ends the run). */
static int proc_reset_signal(lua_State *L) {
  int sig = (int)luaL_optinteger(L, 1, 0);
  if (sig > 0) cozy_signals_restore(sig);
  else cozy_signals_reset();
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

/*
** proc.spawn(argv, env, on_line [, opts]) -> how, code [, stopped]
** argv: { path, args... }; env: array of "K=V" (nil: inherit ours);
** on_line(stream, line) with stream "stdout" or "stderr"; a line longer
** than LINE_CAP bytes comes in pieces of that size, a partial last line at
** end of file. how is "exit" (code = status) or "signal" (code = signal).
** opts.cwd: the child's working directory (argv[1] is made absolute first,
** so a relative path still names the same file and $0 is a full path).
** opts.deadline: a sys.monotime() value; opts.grace: seconds between the
** SIGTERM and the SIGKILL of the group (default STOP_GRACE).
** opts.lock: a function returning two sys.monotime() values, asked at least
** every SUPERVISE_SLICE: when the group gets SIGTERM and by when it must be
** dead (SIGKILL) because the lock the script runs under may stop being
** ours (stopped = "lock"); an error it raises stops the group at once.
** opts.remove: { file, dir }, what the guardian removes when it acts.
** The child runs in its own process group, with fds 0-2 only and default
** signal dispositions. The group gets SIGTERM, then SIGKILL after the grace:
** on the deadline (stopped = "deadline"), on the runner's SIGTERM/SIGINT/
** SIGHUP (that signal; stopped = "signal"), and once the script has exited,
** for whatever it left running; output is read until the group is gone.
** A guardian (core/guardian.c) holds the same times: should the runner die
** or freeze, it kills the group by the earliest of them.
** opts.endpoint = { server = a cozy.endpoint, port = n, serve = function }:
** the child enters a network namespace of its own (a user namespace too
** where one can be had: then even a root script has no capability outside
** it; else CAP_SYS_ADMIN is dropped from its bounding set), brings its
** loopback up and listens on 127.0.0.1:port there; the runner gets that
** socket (SCM_RIGHTS) and serves it (core/endpoint.c) while the script
** runs, which it execs only once the runner said go. Where no namespace
** can be had the script is not run: spawn returns "refused" and why. A
** serve that asks the script stopped (core/endpoint.c) has the group get
** SIGTERM then SIGKILL after the grace (stopped = "endpoint").
*/
#define LINE_CAP 65536 /* bytes held per stream: the longest line delivered whole */
#define STOP_GRACE 5.0 /* seconds from SIGTERM to SIGKILL of the group */
#define DRAIN_AFTER_KILL                                                                                     \
  1.0 /* seconds to read after SIGKILL: a process that left the group may hold a pipe */
#define SUPERVISE_SLICE 0.1 /* longest wait between looks at the flag, the deadline and the child */

struct stream {
  int fd; /* -1 once closed */
  const char *name;
  char *buf; /* LINE_CAP bytes, a userdata on the stack */
  size_t len; /* bytes of a line not yet complete */
};

struct spawn {
  char **argv, **envp;
  const char *cwd;
  double deadline, grace;
  int cb, errslot;
  pid_t pid;
  struct stream st[2];
  int stop; /* COZY_GO, or why the runner stopped the group */
  int exited, status; /* the script has exited (left a zombie, so the group id stays ours) */
  double term_at, kill_at; /* when the group got SIGTERM, SIGKILL; 0: not yet */
  int lock; /* stack index of opts.lock, or 0 */
  double lock_term, lock_kill; /* what it said last; 0: no bound */
  const char *remove_file, *remove_dir; /* opts.remove, kept alive by opts */
  struct cozy_guardian guard;
  struct cozy_endpoint *endpoint; /* opts.endpoint.server, or NULL */
  int serve, port; /* stack index of opts.endpoint.serve; the port to listen on */
};

/* The absolute form of path, kept alive as a string on the stack. */
static const char *absolute(lua_State *L, const char *path) {
  /* into a buffer the collector owns, not realpath's malloc'd one, which a
  ** memory error raised while the result is pushed would strand */
  char *resolved = lua_newuserdatauv(L, PATH_MAX, 0);
  if (realpath(path, resolved) == NULL) luaL_error(L, "%s: %s", path, strerror(errno));
  lua_pushstring(L, resolved);
  lua_remove(L, -2); /* the buffer */
  return lua_tostring(L, -1);
}

static double opt_seconds(lua_State *L, int opts, const char *field, double def) {
  double v = def;
  if (lua_getfield(L, opts, field) != LUA_TNIL) {
    if (lua_type(L, -1) != LUA_TNUMBER || !(lua_tonumber(L, -1) >= 0))
      luaL_error(L, "spawn: '%s' must be a number >= 0", field);
    v = lua_tonumber(L, -1);
  }
  lua_pop(L, 1);
  return v;
}

/* Reads the arguments into sp; everything it pushes stays on the stack
** (strings, the line buffers), so nothing needs freeing. Raises before any
** descriptor or process exists. */
static void spawn_arguments(lua_State *L, struct spawn *sp) {
  int i;
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_checktype(L, 3, LUA_TFUNCTION);
  if (!lua_isnoneornil(L, 4)) luaL_checktype(L, 4, LUA_TTABLE);
  lua_settop(L, 4); /* what follows is pushed above the arguments */
  memset(sp, 0, sizeof *sp);
  sp->argv = string_array(L, 1, "argv");
  if (sp->argv[0] == NULL) luaL_argerror(L, 1, "empty argv");
  if (!lua_isnoneornil(L, 2)) {
    luaL_checktype(L, 2, LUA_TTABLE);
    sp->envp = string_array(L, 2, "env");
  }
  sp->grace = STOP_GRACE;
  if (!lua_isnil(L, 4)) {
    if (lua_getfield(L, 4, "cwd") != LUA_TNIL) {
      sp->cwd = absolute(L, luaL_checkstring(L, -1));
      sp->argv[0] = (char *)absolute(L, sp->argv[0]);
    }
    sp->deadline = opt_seconds(L, 4, "deadline", 0);
    sp->grace = opt_seconds(L, 4, "grace", STOP_GRACE);
    if (lua_getfield(L, 4, "lock") != LUA_TNIL) {
      luaL_checktype(L, -1, LUA_TFUNCTION);
      sp->lock = lua_gettop(L); /* stays on the stack */
    } else lua_pop(L, 1);
    if (lua_getfield(L, 4, "remove") != LUA_TNIL) {
      luaL_checktype(L, -1, LUA_TTABLE);
      if (lua_geti(L, -1, 1) != LUA_TNIL) sp->remove_file = luaL_checkstring(L, -1);
      if (lua_geti(L, -2, 2) != LUA_TNIL) sp->remove_dir = luaL_checkstring(L, -1);
      lua_pop(L, 2); /* the strings stay referenced by opts.remove */
    }
    lua_pop(L, 1);
    if (lua_getfield(L, 4, "endpoint") != LUA_TNIL) {
      int t = lua_gettop(L);
      luaL_checktype(L, t, LUA_TTABLE);
      lua_getfield(L, t, "server");
      sp->endpoint = cozy_endpoint_check(L, -1); /* kept alive by opts */
      lua_getfield(L, t, "port");
      sp->port = (int)luaL_checkinteger(L, -1);
      if (sp->port < 1 || sp->port > 65535) luaL_error(L, "spawn: endpoint.port must be a TCP port");
      lua_pop(L, 2);
      lua_getfield(L, t, "serve");
      luaL_checktype(L, -1, LUA_TFUNCTION);
      sp->serve = lua_gettop(L); /* stays on the stack, above the table */
    } else lua_pop(L, 1);
  }
  sp->guard.fd = -1;
  for (i = 0; i < 2; i++) {
    sp->st[i].fd = -1;
    sp->st[i].name = i == 0 ? "stdout" : "stderr";
    sp->st[i].buf = (char *)lua_newuserdatauv(L, LINE_CAP, 0);
  }
  sp->cb = 3;
  lua_pushnil(L);
  sp->errslot = lua_gettop(L);
}

static void close_pair(int p[2]) {
  close(p[0]);
  close(p[1]);
}

/* stdout, stderr and the exec report pipes, all O_CLOEXEC; raises with
** none left open. */
static void open_pipes(lua_State *L, int out[2], int err[2], int report[2]) {
  int e;
  if (pipe2(out, O_CLOEXEC) != 0) goto none;
  if (pipe2(err, O_CLOEXEC) != 0) goto one;
  if (pipe2(report, O_CLOEXEC) != 0) goto two;
  return;
two:
  e = errno;
  close_pair(err);
  errno = e;
one:
  e = errno;
  close_pair(out);
  errno = e;
none:
  luaL_error(L, "pipe: %s", strerror(errno));
}

/* Every descriptor from `from` up is closed (close_range, else one by one
** up to the limit). Async-signal-safe. */
void cozy_close_from(int from) {
  struct rlimit rl;
  long fd, max = 65536;
  if (close_range((unsigned)from, ~0U, 0) == 0) return;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < (1u << 20))
    max = (long)rl.rlim_cur;
  for (fd = from; fd < max; fd++) close((int)fd);
}

/* Why the child could not isolate itself (its report: the step, errnos). */
enum { ISOLATED = 0, ISOLATE_UNSHARE, ISOLATE_CAPS, ISOLATE_LOOPBACK, ISOLATE_LISTEN, ISOLATE_LOST };

/* Decimal digits of v into p; their count. Async-signal-safe. */
static size_t put_uint(char *p, unsigned long v) {
  char tmp[24];
  size_t n = 0, i;
  do {
    tmp[n++] = (char)('0' + v % 10);
    v /= 10;
  } while (v > 0);
  for (i = 0; i < n; i++) p[i] = tmp[n - 1 - i];
  return n;
}

static int write_file(const char *path, const char *s, size_t n) {
  int fd = open(path, O_WRONLY | O_CLOEXEC), ok;
  if (fd < 0) return -1;
  ok = write(fd, s, n) == (ssize_t)n;
  close(fd);
  return ok ? 0 : -1;
}

/* "id id 1": the one id of the new user namespace is the one it had. */
static int id_map(const char *path, unsigned long id) {
  char line[64];
  size_t n = put_uint(line, id);
  line[n++] = ' ';
  n += put_uint(line + n, id);
  memcpy(line + n, " 1\n", 3);
  return write_file(path, line, n + 3);
}

/* The child's own network namespace, its loopback up, and a socket
** listening on 127.0.0.1:port in it. Async-signal-safe (after fork).
** Returns the socket, or -1 with why in report. */
static int child_isolate(int port, int report[3]) {
  struct ifreq ifr;
  struct sockaddr_in a;
  unsigned long uid = (unsigned long)geteuid(), gid = (unsigned long)getegid();
  int s;
  if (unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0) {
    /* the script keeps its ids, seen from inside too, where the kernel lets
    ** it map them (not uid 0 without CAP_SETFCAP): else it sees the overflow
    ** id, and its files are still accessed as its own; either way it has no
    ** capability outside */
    if (id_map("/proc/self/uid_map", uid) == 0 && write_file("/proc/self/setgroups", "deny", 4) == 0)
      id_map("/proc/self/gid_map", gid);
  } else {
    report[1] = errno;
    if (unshare(CLONE_NEWNET) != 0) {
      report[0] = ISOLATE_UNSHARE;
      report[2] = errno;
      return -1;
    }
    report[1] = 0;
    /* privileged, without a user namespace: the script must not setns back */
    if (prctl(PR_CAPBSET_DROP, CAP_SYS_ADMIN, 0, 0, 0) != 0) {
      report[0] = ISOLATE_CAPS;
      report[1] = errno;
      return -1;
    }
  }
  memset(&ifr, 0, sizeof ifr);
  memcpy(ifr.ifr_name, "lo", 3);
  s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0 || ioctl(s, SIOCGIFFLAGS, &ifr) != 0 ||
      (ifr.ifr_flags |= IFF_UP, ioctl(s, SIOCSIFFLAGS, &ifr)) != 0) {
    report[0] = ISOLATE_LOOPBACK;
    report[1] = errno;
    if (s >= 0) close(s);
    return -1;
  }
  close(s);
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((unsigned short)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) != 0 || listen(s, 64) != 0) {
    report[0] = ISOLATE_LISTEN;
    report[1] = errno;
    if (s >= 0) close(s);
    return -1;
  }
  return s;
}

/* The child's side of the endpoint: isolated, the listening socket sent to
** the runner (SCM_RIGHTS) with the report; then the runner's go awaited.
** Nothing of the script runs unless both went well. */
static void child_endpoint(int port, int ctl) {
  int report[3] = {ISOLATED, 0, 0}, fd = child_isolate(port, report);
  union {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } u;
  struct iovec iov;
  struct msghdr m;
  char go = 0;
  memset(&m, 0, sizeof m);
  iov.iov_base = report;
  iov.iov_len = sizeof report;
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  if (fd >= 0) {
    struct cmsghdr *c;
    memset(&u, 0, sizeof u);
    m.msg_control = u.buf;
    m.msg_controllen = sizeof u.buf;
    c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
  }
  if (sendmsg(ctl, &m, MSG_NOSIGNAL) != (ssize_t)sizeof report || fd < 0) _exit(126);
  close(fd); /* the runner's copy is the one that serves */
  while (read(ctl, &go, 1) < 0 && errno == EINTR) {}
  if (go != 1) _exit(126);
}

/* The runner's side: the child's listening socket, or -1 and why in report
** (the child, which exits, reported it; or it ended without a word). */
static int receive_listener(int ctl, int report[3]) {
  union {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } u;
  struct iovec iov;
  struct msghdr m;
  struct cmsghdr *c;
  ssize_t n;
  int fd = -1;
  memset(&m, 0, sizeof m);
  memset(&u, 0, sizeof u);
  report[0] = ISOLATE_LOST;
  iov.iov_base = report;
  iov.iov_len = 3 * sizeof(int);
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = u.buf;
  m.msg_controllen = sizeof u.buf;
  while ((n = recvmsg(ctl, &m, MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR) {}
  for (c = n > 0 ? CMSG_FIRSTHDR(&m) : NULL; c != NULL; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN(sizeof(int)))
      memcpy(&fd, CMSG_DATA(c), sizeof fd);
  }
  if (n != (ssize_t)(3 * sizeof(int))) report[0] = ISOLATE_LOST;
  if (report[0] != ISOLATED || fd < 0) {
    if (fd >= 0) close(fd);
    if (report[0] == ISOLATED) report[0] = ISOLATE_LOST;
    return -1;
  }
  return fd;
}

/* Why the script could not be isolated, as one line. */
static void push_refusal(lua_State *L, const int report[3], int port) {
  switch (report[0]) {
    case ISOLATE_UNSHARE:
      lua_pushfstring(L, "no network namespace could be had (with a user namespace: %s; without one: %s)",
                      strerror(report[1]), strerror(report[2]));
      break;
    case ISOLATE_CAPS:
      lua_pushfstring(L, "the network namespace cannot be made safe (dropping CAP_SYS_ADMIN: %s)",
                      strerror(report[1]));
      break;
    case ISOLATE_LOOPBACK:
      lua_pushfstring(L, "the network namespace's loopback could not be brought up (%s)",
                      strerror(report[1]));
      break;
    case ISOLATE_LISTEN:
      lua_pushfstring(L, "cannot listen on 127.0.0.1:%d in the network namespace (%s)", port,
                      strerror(report[1]));
      break;
    default: lua_pushstring(L, "the script's process ended before it was isolated"); break;
  }
}

/* The child, after fork: only async-signal-safe calls until exec. It gets
** fds 0-2 and nothing else (no API socket, no pipe of another child); the
** exec report pipe is kept at fd 3, closed by a successful exec. fds 0-2
** of the runner are always open (cozy_signals_startup), so the pipes are
** above them. */
static void child_exec(const struct spawn *sp, int out_w, int err_w, int report_w, int ctl) {
  int report[2] = {0, 0}, null;
  ssize_t w;
  setpgid(0, 0);
  cozy_signals_child_defaults();
  if (sp->endpoint != NULL) child_endpoint(sp->port, ctl);
  dup2(out_w, 1);
  dup2(err_w, 2);
  null = open("/dev/null", O_RDONLY);
  if (null >= 0) dup2(null, 0);
  if (report_w != 3) report_w = dup3(report_w, 3, O_CLOEXEC) == 3 ? 3 : report_w;
  cozy_close_from(report_w == 3 ? 4 : 3);
  /* strerror is not async-signal-safe (locale, a static buffer): the child
  ** reports which call failed and its errno; the parent formats */
  if (sp->cwd != NULL && chdir(sp->cwd) != 0) {
    report[0] = 1;
  } else if (sp->envp) {
    execve(sp->argv[0], sp->argv, sp->envp);
  } else {
    execv(sp->argv[0], sp->argv);
  }
  report[1] = errno;
  w = write(report_w, report, sizeof report);
  (void)w;
  _exit(127);
}

/* Runs protected: pushes the line's strings (which allocate, so may raise)
** and calls on_line(name, line). */
struct line {
  const char *name, *s;
  size_t len;
};

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
** here raises past proc_spawn's pipes and child. */
static void emit_line(lua_State *L, const struct spawn *sp, const char *name, const char *s, size_t len) {
  struct line ln;
  ln.name = name;
  ln.s = s;
  ln.len = len;
  if (!lua_checkstack(L, 5)) return; /* cannot happen: spawn uses a few slots */
  lua_pushcfunction(L, call_on_line);
  lua_pushvalue(L, sp->cb);
  lua_pushlightuserdata(L, &ln);
  if (lua_pcall(L, 2, 0, 0) != LUA_OK) {
    if (lua_isnil(L, sp->errslot)) lua_replace(L, sp->errslot);
    else lua_pop(L, 1);
  }
}

/* The child's exec report: nothing (exec worked) or why it failed, given
** as the child's own stderr line; it exits 127, as a shell's would. */
static void read_exec_report(lua_State *L, const struct spawn *sp, int report_r) {
  int report[2] = {0, 0};
  ssize_t n;
  while ((n = read(report_r, report, sizeof report)) < 0 && errno == EINTR) {}
  close(report_r);
  if (n == (ssize_t)sizeof report) {
    char msg[512];
    int len = report[0] == 1
        ? snprintf(msg, sizeof msg, "chdir failed: %s: %s", sp->cwd, strerror(report[1]))
        : snprintf(msg, sizeof msg, "exec failed: %s: %s", sp->argv[0], strerror(report[1]));
    if (len < 0) len = 0;
    if ((size_t)len >= sizeof msg) len = (int)sizeof msg - 1;
    emit_line(L, sp, "stderr", msg, (size_t)len);
  }
}

/* Delivers what is buffered (a partial last line) and closes the stream. */
static void stream_close(lua_State *L, const struct spawn *sp, struct stream *st) {
  if (st->len > 0) emit_line(L, sp, st->name, st->buf, st->len);
  st->len = 0;
  close(st->fd);
  st->fd = -1;
}

/* Reads what is there and delivers each complete line. Linear in the output:
** only the bytes just read are scanned, and only they are moved (the part
** after their last newline); a full buffer without one is delivered as is. */
static void stream_read(lua_State *L, const struct spawn *sp, struct stream *st) {
  ssize_t n = read(st->fd, st->buf + st->len, LINE_CAP - st->len);
  size_t start = 0, j;
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {
    stream_close(L, sp, st);
    return;
  }
  for (j = st->len; j < st->len + (size_t)n; j++) {
    if (st->buf[j] == '\n') {
      emit_line(L, sp, st->name, st->buf + start, j - start);
      start = j + 1;
    }
  }
  st->len += (size_t)n;
  if (start == 0 && st->len == LINE_CAP) {
    emit_line(L, sp, st->name, st->buf, st->len);
    start = st->len;
  }
  memmove(st->buf, st->buf + start, st->len - start);
  st->len -= start;
}

/* Whether a process other than the (exited, unreaped) leader is still in
** the group: the leftovers of a script that exited. */
static int group_has_others(pid_t pgid) {
  DIR *d = opendir("/proc");
  struct dirent *e;
  int found = 0;
  if (d == NULL) return 0; /* no /proc: the grace then SIGKILL still apply on a stop */
  while (!found && (e = readdir(d)) != NULL) {
    char path[64], stat[512], *p;
    FILE *f;
    long pid = strtol(e->d_name, &p, 10), pgrp;
    if (*p != '\0' || pid <= 0 || pid == (long)pgid) continue;
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    f = fopen(path, "re");
    if (f == NULL) continue;
    p = fgets(stat, sizeof stat, f) ? strrchr(stat, ')') : NULL; /* the name may hold spaces and ')' */
    fclose(f);
    if (p != NULL && sscanf(p, ") %*c %*d %ld", &pgrp) == 1 && pgrp == (long)pgid) found = 1;
  }
  closedir(d);
  return found;
}

static void signal_group(struct spawn *sp, int sig, double now) {
  kill(-sp->pid, sig);
  if (sig == SIGKILL) sp->kill_at = now;
  else if (sp->term_at == 0) sp->term_at = now;
}

/* One look at the child: a stop (the runner's signal, the deadline) while
** the script runs, its exit (seen without reaping it, so that the group id
** cannot be reused while we signal it), the grace. Returns 1 once all is
** over: the script exited, its output closed, nothing left in its group. */
static int supervise(struct spawn *sp, double now) {
  if (!sp->exited) {
    siginfo_t info;
    int sig = cozy_signals_caught();
    if (sp->stop == COZY_GO && (sig != 0 || (sp->deadline > 0 && now >= sp->deadline))) {
      sp->stop = sig != 0 ? COZY_STOP_SIGNAL : COZY_STOP_DEADLINE;
      signal_group(sp, sig != 0 ? sig : SIGTERM, now);
    } else if (sp->stop == COZY_GO && sp->lock_term > 0 && now >= sp->lock_term) {
      sp->stop = COZY_STOP_LOCK;
      signal_group(sp, SIGTERM, now);
    }
    memset(&info, 0, sizeof info);
    if (waitid(P_PID, (id_t)sp->pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == sp->pid) {
      sp->exited = 1;
      signal_group(sp, SIGTERM, now); /* what it left running (once: a stop already sent it) */
    }
  }
  if (sp->kill_at == 0 &&
      ((sp->term_at > 0 && now >= sp->term_at + sp->grace) || (sp->lock_kill > 0 && now >= sp->lock_kill))) {
    if (sp->stop == COZY_GO && !sp->exited) sp->stop = COZY_STOP_LOCK;
    signal_group(sp, SIGKILL, now);
  }
  if (!sp->exited || sp->st[0].fd >= 0 || sp->st[1].fd >= 0) return 0;
  return sp->kill_at > 0 || !group_has_others(sp->pid);
}

/* Runs protected: opts.lock() -> term_at, kill_by. */
static int call_lock(lua_State *L) {
  lua_pushvalue(L, 1);
  lua_call(L, 0, 2);
  lua_pushnumber(L, luaL_checknumber(L, -2));
  lua_pushnumber(L, luaL_checknumber(L, -2));
  return 2;
}

/* What the lock says now: a failure (kept at errslot) stops the group at
** once, as a lost lock does. */
static void ask_lock(lua_State *L, struct spawn *sp, double now) {
  if (sp->lock == 0 || !lua_checkstack(L, 4)) return;
  lua_pushcfunction(L, call_lock);
  lua_pushvalue(L, sp->lock);
  if (lua_pcall(L, 1, 2, 0) != LUA_OK) {
    if (lua_isnil(L, sp->errslot)) lua_replace(L, sp->errslot);
    else lua_pop(L, 1);
    sp->lock_term = sp->lock_kill = now;
    sp->lock = 0; /* asked no more: the bound stays */
    return;
  }
  sp->lock_term = lua_tonumber(L, -2);
  sp->lock_kill = lua_tonumber(L, -1);
  lua_pop(L, 2);
}

/* The time by which the group must be dead, for the guardian: the
** earliest of the deadline's SIGKILL, the lock's, and that of a stop
** under way; 0: none. */
static double kill_by(const struct spawn *sp) {
  double t = 0;
  if (sp->deadline > 0) t = sp->deadline + sp->grace;
  if (sp->lock_kill > 0 && (t == 0 || sp->lock_kill < t)) t = sp->lock_kill;
  if (sp->term_at > 0 && (t == 0 || sp->term_at + sp->grace < t)) t = sp->term_at + sp->grace;
  return t;
}

/* Until supervise says it is over: output delivered as it comes. After the
** SIGKILL, a pipe still open is held by a process that left the group: it is
** read a little longer, then closed. */
static void supervise_loop(lua_State *L, struct spawn *sp) {
  for (;;) {
    struct pollfd pfd[3 + COZY_ENDPOINT_MAX_CONNS];
    double now = cozy_monotime(), wait = SUPERVISE_SLICE;
    int i, n = 0, served = 0;
    ask_lock(L, sp, now);
    if (supervise(sp, now)) return;
    cozy_guardian_extend(&sp->guard, kill_by(sp));
    for (i = 0; i < 2; i++) {
      if (sp->st[i].fd >= 0 && sp->kill_at > 0 && now >= sp->kill_at + DRAIN_AFTER_KILL)
        stream_close(L, sp, &sp->st[i]);
      if (sp->st[i].fd < 0) continue;
      pfd[n].fd = sp->st[i].fd;
      pfd[n].events = POLLIN;
      pfd[n].revents = 0;
      n++;
    }
    if (n == 0) wait = SUPERVISE_SLICE / 10; /* only the exit or the group's end is awaited */
    if (sp->deadline > 0 && sp->stop == COZY_GO && sp->deadline - now < wait) wait = sp->deadline - now;
    if (wait < 0.001) wait = 0.001;
    /* the script's endpoint, served while the script runs */
    if (sp->endpoint != NULL && !sp->exited)
      served = cozy_endpoint_fill(sp->endpoint, pfd + n, (int)(sizeof pfd / sizeof pfd[0]) - n);
    if (poll(pfd, (nfds_t)(n + served), (int)(wait * 1000)) <= 0) continue; /* EINTR: a signal, seen above */
    if (served > 0) {
      cozy_endpoint_handle(L, sp->endpoint, pfd + n, served, sp->serve, sp->errslot);
      /* a run bound to a plan: the script wrote what the plan does not hold */
      if (sp->stop == COZY_GO && cozy_endpoint_stopping(sp->endpoint)) {
        sp->stop = COZY_STOP_ENDPOINT;
        signal_group(sp, SIGTERM, cozy_monotime());
      }
    }
    for (i = 0; i < 2; i++) {
      struct stream *st = &sp->st[i];
      int k;
      for (k = 0; k < n; k++) {
        if (st->fd >= 0 && pfd[k].fd == st->fd && (pfd[k].revents & (POLLIN | POLLHUP | POLLERR)))
          stream_read(L, sp, st);
      }
    }
  }
}

static int proc_spawn(lua_State *L) {
  struct spawn sp;
  int out[2], err[2], report[2], ctl[2] = {-1, -1}, status;
  char go = 1;
  spawn_arguments(L, &sp);
  open_pipes(L, out, err, report);
  if (sp.endpoint != NULL && socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ctl) != 0) {
    int e = errno;
    close_pair(out);
    close_pair(err);
    close_pair(report);
    return luaL_error(L, "socketpair: %s", strerror(e));
  }
  sp.pid = fork();
  if (sp.pid < 0) {
    int e = errno;
    close_pair(out);
    close_pair(err);
    close_pair(report);
    if (ctl[0] >= 0) close_pair(ctl);
    return luaL_error(L, "fork: %s", strerror(e));
  }
  if (sp.pid == 0) child_exec(&sp, out[1], err[1], report[1], ctl[1]);
  setpgid(sp.pid, sp.pid); /* as the child does: whichever runs first */
  close(out[1]);
  close(err[1]);
  close(report[1]);
  if (ctl[1] >= 0) close(ctl[1]);
  if (sp.endpoint != NULL) {
    int why[3] = {0, 0, 0}, listener = receive_listener(ctl[0], why);
    if (listener < 0) {
      /* not isolated: the script is not run (the child exits without exec) */
      close(ctl[0]);
      kill(-sp.pid, SIGKILL);
      while (waitpid(sp.pid, &status, 0) < 0 && errno == EINTR) {}
      close(out[0]);
      close(err[0]);
      close(report[0]);
      lua_pushstring(L, "refused");
      push_refusal(L, why, sp.port);
      return 2;
    }
    cozy_endpoint_attach(sp.endpoint, listener);
  }
  ask_lock(L, &sp, cozy_monotime());
  if (cozy_guardian_start(&sp.guard, sp.pid, kill_by(&sp), sp.remove_file, sp.remove_dir) != 0) {
    /* no script runs unguarded */
    int e = errno;
    kill(-sp.pid, SIGKILL);
    while (waitpid(sp.pid, &status, 0) < 0 && errno == EINTR) {}
    close(out[0]);
    close(err[0]);
    close(report[0]);
    if (sp.endpoint != NULL) {
      close(ctl[0]);
      cozy_endpoint_detach(sp.endpoint);
    }
    return luaL_error(L, "cannot start the guardian of %s: %s", sp.argv[0], strerror(e));
  }
  if (sp.endpoint != NULL) {
    /* guarded and served: the script may run */
    ssize_t w = send(ctl[0], &go, 1, MSG_NOSIGNAL);
    (void)w; /* a child that died meanwhile is seen by the supervision */
    close(ctl[0]);
  }
  sp.st[0].fd = out[0];
  sp.st[1].fd = err[0];
  read_exec_report(L, &sp, report[0]);
  supervise_loop(L, &sp);
  if (sp.endpoint != NULL) cozy_endpoint_detach(sp.endpoint);
  cozy_guardian_finish(&sp.guard); /* before the reaping that frees the group's id */
  while (waitpid(sp.pid, &status, 0) < 0 && errno == EINTR) {}
  if (!lua_isnil(L, sp.errslot)) return lua_error(L); /* the callback's error */
  lua_pushstring(L, WIFSIGNALED(status) ? "signal" : "exit");
  lua_pushinteger(L, WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
  if (sp.stop == COZY_GO) return 2;
  lua_pushstring(L, cozy_stop_name(sp.stop));
  return 3;
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
