/* The engine's one clock (core/clock.c): every duration, deadline and
** timeout in C and Lua (sys.monotime) is read from it, so a deadline taken
** in one module means the same instant in all the others. */
#ifndef COZY_CLOCK_H
#define COZY_CLOCK_H

#include <time.h>

/* The clock itself: never jumps (NTP steps, `date -s`). Timers
** (timer_create) and condition variables (pthread_condattr_setclock) that
** wait for a deadline are set to it too. */
#define COZY_CLOCK CLOCK_MONOTONIC

/* Seconds on COZY_CLOCK. */
double cozy_monotime(void);
/* The instant `seconds` (>= 0) from now on COZY_CLOCK, as the timespec that
** timed waits take. */
struct timespec cozy_monotime_after(double seconds);

#endif
