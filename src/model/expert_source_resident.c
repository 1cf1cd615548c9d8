#include "model/expert_source.h"
#include "base/file_io.h"
#include "base/progress.h"

#include <stdlib.h>
#include <string.h>

void expert_record_layout(const model_config *c, uint64_t offsets[EXPERT_PARTS + 1]) {
    const uint64_t d = (uint64_t)c->hidden_size, inter = (uint64_t)c->moe_intermediate_size;
    const uint64_t sizes[EXPERT_PARTS] = {inter * d / 2, inter * d / 32, inter * d / 2, inter * d / 32,
                                          d * inter / 2, d * inter / 32};
    offsets[0] = 0;
    for (int p = 0; p < EXPERT_PARTS; p++) offsets[p + 1] = offsets[p] + sizes[p];
}

void expert_view_from_record(const model_config *c, const uint8_t *record, expert_view *v) {
    uint64_t o[EXPERT_PARTS + 1];
    expert_record_layout(c, o);
    const int d = c->hidden_size, inter = c->moe_intermediate_size;
    v->w1 = (fp4_matrix){record + o[EXPERT_W1_WEIGHT], record + o[EXPERT_W1_SCALE], inter, d};
    v->w3 = (fp4_matrix){record + o[EXPERT_W3_WEIGHT], record + o[EXPERT_W3_SCALE], inter, d};
    v->w2 = (fp4_matrix){record + o[EXPERT_W2_WEIGHT], record + o[EXPERT_W2_SCALE], d, inter};
}

typedef struct {
    expert_source base;
    const model_weights *m;
    uint8_t *records; /* [blocks][experts][record bytes] */
    uint64_t record_bytes;
} resident_source;

static int resident_acquire(expert_source *self, int block, const int32_t *ids, int n, expert_view *views,
                            ds4f_error *err) {
    resident_source *s = (resident_source *)self;
    const model_config *c = &s->m->config;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= c->n_routed_experts) return error_set(err, "expert id %d out of range", ids[i]);
        const uint8_t *rec = s->records + ((uint64_t)block * c->n_routed_experts + (uint64_t)ids[i]) * s->record_bytes;
        expert_view_from_record(c, rec, &views[i]);
    }
    return 0;
}

static void resident_release(expert_source *self, int block, const int32_t *ids, int n) {}

static void resident_destroy(expert_source *self) {
    resident_source *s = (resident_source *)self;
    free(s->records);
    free(s);
}

int expert_source_resident_create(const model_weights *m, int show_progress, expert_source **out, ds4f_error *err) {
    const model_config *c = &m->config;
    uint64_t layout[EXPERT_PARTS + 1];
    expert_record_layout(c, layout);
    resident_source *s = calloc(1, sizeof *s);
    if (!s) return error_set(err, "out of memory");
    s->m = m;
    s->record_bytes = layout[EXPERT_PARTS];
    uint64_t total = s->record_bytes * (uint64_t)m->n_blocks * (uint64_t)c->n_routed_experts;
    s->records = malloc(total ? total : 1);
    if (!s->records) {
        free(s);
        return error_set(err, "cannot allocate %.2f GB to hold every routed expert in RAM", (double)total / 1e9);
    }
    progress bar;
    progress_begin(&bar, "experts", total, "B");
    if (!show_progress) bar.enabled = 0;
    uint64_t done = 0;
    for (int blk = 0; blk < m->n_blocks; blk++)
        for (int e = 0; e < c->n_routed_experts; e++) {
            uint8_t *rec = s->records + ((uint64_t)blk * c->n_routed_experts + (uint64_t)e) * s->record_bytes;
            const expert_extent *x = expert_extents(m, blk, e);
            for (int p = 0; p < EXPERT_PARTS; p++) {
                if (x[p].bytes != layout[p + 1] - layout[p]) {
                    resident_destroy(&s->base);
                    return error_set(err, "expert %d of block %d: part %d has %llu bytes, expected %llu", e, blk, p,
                                     (unsigned long long)x[p].bytes, (unsigned long long)(layout[p + 1] - layout[p]));
                }
                const st_file *f = &m->ck.shards[x[p].shard];
                if (file_pread_exact(f->fd, rec + layout[p], x[p].bytes, x[p].offset, f->path, err) != 0) {
                    resident_destroy(&s->base);
                    return -1;
                }
            }
            done += s->record_bytes;
            progress_update(&bar, done);
        }
    progress_end(&bar);
    s->base.acquire = resident_acquire;
    s->base.release = resident_release;
    s->base.destroy = resident_destroy;
    *out = &s->base;
    return 0;
}
