/* The MoE sublayer's own working memory (moe.c), exposed so the memory planner can count it. */
#ifndef DS4F_NN_MOE_H
#define DS4F_NN_MOE_H

#include <stddef.h>

#include "format/config.h"

/* Bytes of the per-thread workspace moe_forward keeps for chunks of up to max_chunk tokens. */
size_t moe_workspace_bytes(const model_config *c, int max_chunk);

/* Frees the calling thread's workspace (it is otherwise kept for the thread's lifetime). */
void moe_workspace_release(void);

#endif
