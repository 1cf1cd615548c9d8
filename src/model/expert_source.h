/* How the forward pass gets routed experts: it asks for the experts of one layer, uses the views
 * until it releases them. Implementations: all experts resident in RAM (below), and the streaming
 * cache of the stream layer. An implementation must hand out only experts whose bytes all arrived
 * (invariant 3) and must not change which bytes a view shows (invariant 2). */
#ifndef DS4F_MODEL_EXPERT_SOURCE_H
#define DS4F_MODEL_EXPERT_SOURCE_H

#include "model/weights.h"

typedef struct expert_view {
    fp4_matrix w1; /* gate_proj [inter, d] */
    fp4_matrix w3; /* up_proj   [inter, d] */
    fp4_matrix w2; /* down_proj [d, inter] */
} expert_view;

typedef struct expert_source expert_source;
struct expert_source {
    /* Makes experts ids[0..n) of `block` available and fills views[0..n). */
    int (*acquire)(expert_source *self, int block, const int32_t *ids, int n, expert_view *views, ds4f_error *err);
    void (*release)(expert_source *self, int block, const int32_t *ids, int n);
    void (*destroy)(expert_source *self);
};

/* Reads every routed expert into RAM once (fine when they fit: the golden and small synthetic
 * models, or a big machine). */
int expert_source_resident_create(const model_weights *m, int show_progress, expert_source **out, ds4f_error *err);

/* Points views at one expert's six tensors laid out as in a contiguous record
 * (w1 weight, w1 scale, w3 weight, w3 scale, w2 weight, w2 scale). */
void expert_view_from_record(const model_config *c, const uint8_t *record, expert_view *v);
/* Byte offsets of the six parts inside such a record. */
void expert_record_layout(const model_config *c, uint64_t offsets[EXPERT_PARTS + 1]);

#endif
