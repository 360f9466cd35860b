/*
** Guardians (see guardian.h): a child process group that ends with the
** runner, even when the runner is killed with SIGKILL, which no handler of
** ours sees.
**
** Why a forked process and a pipe: the kernel closes a dead process's
** descriptors whatever killed it, so the read end of a pipe whose only
** writer is the runner sees end of file at the runner's death and at no
** other time. The write end is O_CLOEXEC and every child closes what it does
** not need (cozy_close_from), so no script or plugin keeps it open. A
** PR_SET_PDEATHSIG on the script would reach the script alone, not the
** commands it started, and a runner that is alive but frozen (SIGSTOP, a
** blocked log write) never dies: the kill-by time the runner keeps sending
** covers that too. The guardian is forked (not exec'd: one binary, no helper
** mode to keep apart from the CLI) from a process whose other threads may
** hold locks, so between fork and _exit it makes async-signal-safe calls
** only: poll, read, kill, clock_gettime, unlink, rmdir, open, dup2, setsid,
** close_range, _exit; the paths it removes were computed before the fork.
**
** It runs in a session of its own, so that a signal to the runner's process
** group (SIGKILL of the whole group, a terminal's SIGINT) does not take it
** with the runner while the script's group, which is its own, lives on.
**
** What it does not reach: a process of the script that left the group (setsid,
** `setsid kubectl port-forward &`). Nothing started that way is found, then
** or by the runner's own stop.
*/
#define _GNU_SOURCE /* pipe2 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "guardian.h"
#include "proc.h"
#include "signals.h"

#define GUARD_LOOK 0.05 /* seconds between looks at a group that was sent SIGTERM */
#define STAND_DOWN (-1.0)

/* cozy_monotime without anything but clock_gettime (async-signal-safe). */
static double now_safe(void) {
  struct timespec ts;
  clock_gettime(COZY_CLOCK, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The guardian itself, after fork: never returns. */
static void guard(int fd, pid_t pgid, double kill_by, const char *remove_file, const char *remove_dir) {
  double term_at = 0, msgs[32];
  int null;
  cozy_signals_child_defaults();
  setsid();
  if (fd != 3) fd = dup2(fd, 3) == 3 ? 3 : fd;
  null = open("/dev/null", O_RDWR);
  if (null >= 0) {
    dup2(null, 0);
    dup2(null, 1);
    dup2(null, 2);
  }
  cozy_close_from(fd == 3 ? 4 : 3); /* fd is 3 unless dup2 failed, which it cannot here */
  for (;;) {
    double now = now_safe(), until = kill_by;
    int ms = -1;
    if (term_at > 0 && (until <= 0 || term_at + COZY_GUARDIAN_GRACE < until))
      until = term_at + COZY_GUARDIAN_GRACE;
    if (until > 0 && now >= until) break;
    if (until > 0) ms = (int)((until - now) * 1000) + 1;
    if (term_at > 0) {
      /* the runner is gone: done as soon as nothing is left in the group */
      if (kill(-pgid, 0) != 0 && errno == ESRCH) break;
      if (ms < 0 || ms > GUARD_LOOK * 1000) ms = (int)(GUARD_LOOK * 1000);
      poll(NULL, 0, ms);
      continue;
    }
    {
      struct pollfd p = {fd, POLLIN, 0};
      ssize_t n;
      if (poll(&p, 1, ms) <= 0) continue; /* the time is checked above; EINTR: again */
      n = read(fd, msgs, sizeof msgs);
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n > 0 && n < (ssize_t)sizeof msgs[0]) continue; /* cannot happen: each write is whole */
      if (n >= (ssize_t)sizeof msgs[0]) {
        double last = msgs[(size_t)n / sizeof msgs[0] - 1];
        if (last <= STAND_DOWN) _exit(0); /* the group is over: the runner reaps it */
        kill_by = last;
        continue;
      }
      /* end of file (or a broken pipe): the runner is gone */
      kill(-pgid, SIGTERM);
      term_at = now_safe();
    }
  }
  kill(-pgid, SIGKILL);
  if (remove_file) unlink(remove_file);
  if (remove_dir) rmdir(remove_dir);
  _exit(0);
}

int cozy_guardian_start(struct cozy_guardian *g, pid_t pgid, double kill_by, const char *remove_file,
                        const char *remove_dir) {
  int p[2], e;
  pid_t pid;
  g->pid = 0;
  g->fd = -1;
  g->kill_by = kill_by;
  if (pipe2(p, O_CLOEXEC) != 0) return -1;
  pid = fork();
  if (pid == 0) {
    close(p[1]);
    guard(p[0], pgid, kill_by, remove_file, remove_dir);
  }
  e = errno;
  close(p[0]);
  if (pid < 0) {
    close(p[1]);
    errno = e;
    return -1;
  }
  /* a guardian that stops reading (SIGSTOP) must not block the runner */
  fcntl(p[1], F_SETFL, O_NONBLOCK);
  g->pid = pid;
  g->fd = p[1];
  return 0;
}

void cozy_guardian_extend(struct cozy_guardian *g, double kill_by) {
  if (g->fd < 0 || kill_by == g->kill_by) return;
  if (write(g->fd, &kill_by, sizeof kill_by) == (ssize_t)sizeof kill_by) g->kill_by = kill_by;
}

void cozy_guardian_finish(struct cozy_guardian *g) {
  int st;
  if (g->pid <= 0) return;
  if (g->fd >= 0) {
    double stand_down = STAND_DOWN;
    ssize_t w;
    /* blocking: the stand-down must arrive, or the guardian would read end
    ** of file and stop a group that is already over (EPIPE: it has gone) */
    fcntl(g->fd, F_SETFL, 0);
    do w = write(g->fd, &stand_down, sizeof stand_down);
    while (w < 0 && errno == EINTR);
    close(g->fd);
    g->fd = -1;
  }
  while (waitpid(g->pid, &st, 0) < 0 && errno == EINTR) {}
  g->pid = 0;
}
