#include "base/progress.h"
#include "base/timer.h"

#include <stdio.h>
#include <unistd.h>

void progress_begin(progress *p, const char *label, uint64_t total, const char *unit) {
    p->label = label;
    p->total = total;
    p->unit = unit;
    p->start_seconds = time_now_seconds();
    p->last_draw_seconds = 0;
    p->enabled = isatty(2);
}

static void draw(progress *p, uint64_t done, int final) {
    double now = time_now_seconds();
    double elapsed = now - p->start_seconds;
    double frac = p->total ? (double)done / (double)p->total : 1.0;
    int width = 30, filled = (int)(frac * width + 0.5);
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < filled ? '#' : '.';
    bar[width] = 0;
    if (p->unit && p->unit[0] == 'B' && p->unit[1] == 0)
        fprintf(stderr, "\r%-10s [%s] %5.1f%% %.2f/%.2f GB %.1fs%s", p->label, bar, frac * 100.0,
                (double)done / 1e9, (double)p->total / 1e9, elapsed, final ? "\n" : "");
    else
        fprintf(stderr, "\r%-10s [%s] %5.1f%% %llu/%llu %s %.1fs%s", p->label, bar, frac * 100.0,
                (unsigned long long)done, (unsigned long long)p->total, p->unit ? p->unit : "", elapsed,
                final ? "\n" : "");
    fflush(stderr);
    p->last_draw_seconds = now;
}

void progress_update(progress *p, uint64_t done) {
    if (!p->enabled) return;
    double now = time_now_seconds();
    if (now - p->last_draw_seconds < 0.1) return;
    draw(p, done, 0);
}

void progress_end(progress *p) {
    if (!p->enabled) return;
    draw(p, p->total, 1);
}
