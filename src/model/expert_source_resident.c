#include "model/expert_source.h"
#include "base/large_alloc.h"
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

void expert_view_from_parts(const model_config *c, const uint8_t *base, const uint64_t part_offsets[EXPERT_PARTS],
                            expert_view *v) {
    const int d = c->hidden_size, inter = c->moe_intermediate_size;
    v->w1 = (fp4_matrix){base + part_offsets[EXPERT_W1_WEIGHT], base + part_offsets[EXPERT_W1_SCALE], inter, d};
    v->w3 = (fp4_matrix){base + part_offsets[EXPERT_W3_WEIGHT], base + part_offsets[EXPERT_W3_SCALE], inter, d};
    v->w2 = (fp4_matrix){base + part_offsets[EXPERT_W2_WEIGHT], base + part_offsets[EXPERT_W2_SCALE], d, inter};
}

void expert_view_from_record(const model_config *c, const uint8_t *record, expert_view *v) {
    uint64_t o[EXPERT_PARTS + 1];
    expert_record_layout(c, o);
    expert_view_from_parts(c, record, o, v);
}

int expert_request_acquire_all(expert_source *src, expert_request *req, ds4f_error *err) {
    if (src->begin(src, req, err) != 0) return -1;
    int index, rc;
    while ((rc = src->next(src, req, &index, err)) == 1) {
    }
    if (rc < 0) {
        src->end(src, req);
        return -1;
    }
    return 0;
}

void expert_request_release(expert_source *src, expert_request *req) { src->end(src, req); }

typedef struct {
    expert_source base;
    const model_weights *m;
    uint8_t *records; /* [blocks][experts][record bytes] */
    uint64_t record_bytes;
} resident_source;

static int resident_begin(expert_source *self, expert_request *req, ds4f_error *err) {
    resident_source *s = (resident_source *)self;
    const model_config *c = &s->m->config;
    if (req->block < 0 || req->block >= s->m->n_blocks) return error_set(err, "block %d out of range", req->block);
    if (req->n < 0 || req->n > EXPERT_REQUEST_MAX) return error_set(err, "request of %d experts", req->n);
    req->delivered = 0;
    for (int i = 0; i < req->n; i++) {
        if (req->ids[i] < 0 || req->ids[i] >= c->n_routed_experts)
            return error_set(err, "expert id %d out of range", req->ids[i]);
        const uint8_t *rec =
            s->records + ((uint64_t)req->block * c->n_routed_experts + (uint64_t)req->ids[i]) * s->record_bytes;
        expert_view_from_record(c, rec, &req->views[i]);
        req->status[i] = EXPERT_PENDING;
        req->handle[i] = -1;
    }
    return 0;
}

/* Everything is in RAM: deliver in ascending order. */
static int resident_next(expert_source *self, expert_request *req, int *index, ds4f_error *err) {
    if (req->delivered == req->n) return 0;
    *index = req->delivered;
    req->status[req->delivered++] = EXPERT_DELIVERED;
    return 1;
}

static void resident_finish(expert_source *self, expert_request *req, int index) { req->status[index] = EXPERT_FINISHED; }

static void resident_end(expert_source *self, expert_request *req) {}

static void resident_destroy(expert_source *self) {
    resident_source *s = (resident_source *)self;
    free(s->records);
    free(s);
}

int expert_source_resident_create(const model_weights *m, int show_progress, expert_source **out, ds4f_error *err) {
    const model_config *c = &m->config;
    uint64_t layout[EXPERT_PARTS + 1];
    expert_record_layout(c, layout);
    if (c->n_routed_experts > EXPERT_REQUEST_MAX)
        return error_set(err, "%d routed experts per layer: at most %d are supported", c->n_routed_experts,
                         EXPERT_REQUEST_MAX);
    resident_source *s = calloc(1, sizeof *s);
    if (!s) return error_set(err, "out of memory");
    s->m = m;
    s->record_bytes = layout[EXPERT_PARTS];
    uint64_t total = s->record_bytes * (uint64_t)m->n_blocks * (uint64_t)c->n_routed_experts;
    s->records = large_alloc(total);
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
    s->base.begin = resident_begin;
    s->base.next = resident_next;
    s->base.ready = resident_next; /* never waits */
    s->base.finish = resident_finish;
    s->base.end = resident_end;
    s->base.destroy = resident_destroy;
    *out = &s->base;
    return 0;
}
