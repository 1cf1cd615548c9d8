#ifndef DS4F_BASE_TIMER_H
#define DS4F_BASE_TIMER_H
/* Monotonic wall clock in seconds. */
double time_now_seconds(void);
#endif
