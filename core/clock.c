/* The engine's one clock (clock.h). */
#include "clock.h"

double cozy_monotime(void) {
  struct timespec ts;
  clock_gettime(COZY_CLOCK, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

struct timespec cozy_monotime_after(double seconds) {
  struct timespec ts;
  clock_gettime(COZY_CLOCK, &ts);
  if (seconds > 0) {
    double whole = (double)(time_t)seconds;
    ts.tv_sec += (time_t)seconds;
    ts.tv_nsec += (long)((seconds - whole) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
  }
  return ts;
}
