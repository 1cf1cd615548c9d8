#ifndef DS4F_BASE_TIMER_H
#define DS4F_BASE_TIMER_H
/* Monotonic wall clock in seconds. */
double time_now_seconds(void);
/* CPU seconds of the whole process (all threads, user and system). */
double time_process_cpu_seconds(void);
#endif
