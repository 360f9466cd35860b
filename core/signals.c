/*
** Signals: the stop flag and its handlers, and the descriptors a process
** must have before it opens anything.
**
** SIGTERM (a deleted Job's pod), SIGINT and SIGHUP (a closed terminal or
** session), once trapped, only set a flag:
** the runner polls it at safe points (between steps, before each write), so
** a step is never left half stamped. The flag is the one process-wide
** mutable value a handler may touch; the handler also asks the watches
** (core/watch.c) to stop Lua code that never reaches a safe point.
*/
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "signals.h"
#include "watch.h"

static volatile sig_atomic_t caught_signal = 0;
/* the thread that trapped; read by any thread (the transport asks) */
static pthread_t trap_thread;
static atomic_int trapped = 0;

static void on_sigpipe(int sig) {
  (void)sig;
}

/* Caught rather than SIG_IGN: a caught signal is reset to its default by
** exec, so the processes we start (a legacy script, `sh` under os.execute)
** get the SIGPIPE every program expects, while our own writes fail with
** EPIPE. */
static void ignore_sigpipe(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigpipe;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGPIPE, &sa, NULL);
}

void cozy_signals_startup(void) {
  int fd;
  for (fd = 0; fd <= 2; fd++) {
    if (fcntl(fd, F_GETFD) == -1 && errno == EBADF) {
      /* the lowest free descriptor: this one */
      int got = open("/dev/null", O_RDWR);
      if (got > 2) close(got); /* cannot happen: fd was free */
    }
  }
  ignore_sigpipe();
}

static void on_signal(int sig) {
  int saved = errno;
  caught_signal = sig;
  cozy_watch_alarm(sig);
  errno = saved;
}

int cozy_signals_trap(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGTERM, &sa, NULL) != 0 || sigaction(SIGINT, &sa, NULL) != 0 ||
      sigaction(SIGHUP, &sa, NULL) != 0)
    return errno;
  trap_thread = pthread_self();
  atomic_store(&trapped, 1);
  return 0;
}

int cozy_signals_caught(void) {
  return caught_signal;
}

void cozy_signals_reset(void) {
  caught_signal = 0;
}

void cozy_signals_restore(int sig) {
  if (caught_signal == 0) caught_signal = sig;
}

int cozy_signals_stop_pending(void) {
  if (caught_signal == 0 || !atomic_load(&trapped) || !pthread_equal(pthread_self(), trap_thread)) return 0;
  return caught_signal;
}

void cozy_signals_child_defaults(void) {
  static const int changed[] = {SIGTERM, SIGINT, SIGHUP, SIGPIPE, SIGALRM};
  sigset_t none;
  size_t i;
  for (i = 0; i < sizeof changed / sizeof changed[0]; i++) signal(changed[i], SIG_DFL);
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
}
