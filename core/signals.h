/* Signals and the standard descriptors (core/signals.c): the one owner of
** the stop flag and its handlers. SIGTERM, SIGINT and SIGHUP, once trapped, only
** record the signal; the runner, the watches (core/watch.c) and the child
** processes (core/proc.c) read it from here. */
#ifndef COZY_SIGNALS_H
#define COZY_SIGNALS_H

/* First thing in main, before anything can open a descriptor: fds 0-2 are
** opened onto /dev/null when closed, so that no socket or file becomes
** stdout or stderr; SIGPIPE is caught and ignored, so that a closed
** reader of our output makes a write fail (EPIPE) instead of killing a run
** holding the lock (exec gives our children the default back). */
void cozy_signals_startup(void);

/* From now on SIGTERM, SIGINT and SIGHUP set the stop flag instead of killing the
** process; the calling thread becomes the one whose own waits a pending
** stop ends (cozy_signals_stop_pending). 0, or an errno. */
int cozy_signals_trap(void);

/* The signal caught since the last reset, or 0. */
int cozy_signals_caught(void);
void cozy_signals_reset(void);
/* Sets the flag to sig unless a signal was caught since the last reset. */
void cozy_signals_restore(int sig);

/* The caught signal when called on the thread that trapped, else 0: what
** ends a wait or a request of the runner's own, with no watch armed (the
** lease worker's thread, which keeps the lock fresh, is not stopped). */
int cozy_signals_stop_pending(void);

/* In a forked child, before exec (async-signal-safe): default dispositions
** for every signal we change, and an empty mask. */
void cozy_signals_child_defaults(void);

#endif
