/* Guardians (core/guardian.c): what makes a child process group of ours
** end with us, even when we are killed with SIGKILL. A legacy script and an
** exec credential plugin each get one: a small process forked beside the
** group, holding the read end of a pipe whose write end only the runner
** holds. It kills the group when it reads end of file (the runner is gone,
** however it died) or when the kill-by time the runner last gave it has
** passed (the runner is frozen or stuck: its step's time limit, or the time
** its lock is certainly still its own, is over). */
#ifndef COZY_GUARDIAN_H
#define COZY_GUARDIAN_H

#include <sys/types.h>

struct cozy_guardian {
  pid_t pid; /* 0: none */
  int fd; /* the pipe's write end, -1 once closed */
  double kill_by; /* the last kill-by time sent */
};

/* Seconds between a guardian's SIGTERM and SIGKILL of the group when the
** runner is gone (bounded by the kill-by time). */
#define COZY_GUARDIAN_GRACE 2.0

/* Forks a guardian of process group `pgid`: SIGKILL by `kill_by`
** (COZY_CLOCK seconds; 0: no time limit), and on our end SIGTERM, then
** SIGKILL after COZY_GUARDIAN_GRACE (at the latest by kill_by); then it
** unlinks `remove_file` and removes `remove_dir` (either may be NULL: paths
** computed before the fork, for the guardian may not allocate). 0, or -1
** with errno (no guardian). Call from the thread that will finish it. */
int cozy_guardian_start(struct cozy_guardian *g, pid_t pgid, double kill_by, const char *remove_file,
                        const char *remove_dir);
/* A new kill-by time for the guardian (sent only when it changed). */
void cozy_guardian_extend(struct cozy_guardian *g, double kill_by);
/* The group is over (not yet reaped, so its id is still ours): the guardian
** stands down and is reaped. Call before reaping the group's leader. */
void cozy_guardian_finish(struct cozy_guardian *g);

#endif
