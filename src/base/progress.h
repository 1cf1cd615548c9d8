/* One-line progress display on stderr for long work (loading, prefill, synth, pack). Draws only
 * when stderr is a terminal, so logs and tests stay clean; redraws at most ~10 times a second. */
#ifndef DS4F_BASE_PROGRESS_H
#define DS4F_BASE_PROGRESS_H

#include <stdint.h>

typedef struct progress {
    const char *label;
    uint64_t total;        /* units of work (bytes, tokens, tensors) */
    const char *unit;      /* "B" shows sizes in GB/MB, anything else shows counts */
    double start_seconds;
    double last_draw_seconds;
    int enabled;
} progress;

void progress_begin(progress *p, const char *label, uint64_t total, const char *unit);
void progress_update(progress *p, uint64_t done);
void progress_end(progress *p);

#endif
