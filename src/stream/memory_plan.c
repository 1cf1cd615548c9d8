#include "stream/memory_plan.h"

#include "kernels/kernels.h"
#include "base/file_io.h"
#include "nn/moe.h"
#include "nn/session.h"
#include "model/weights.h"

#include <ctype.h>
#include <stdarg.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* Memory sizes print in GiB, as --ram parses "16G" (a "16 GB" laptop has 16 GiB). */
#define GIB 1073741824.0

uint64_t memory_plan_resident_bytes(const checkpoint *ck) {
    /* weights.c: every non-expert tensor 64-byte aligned in one arena, each 1-D BF16 tensor
     * (norm weights) again as f32, and the row-major FP8 matrices (all but wo_a, used dequantized)
     * their low-code lists, counted at their limit (the actual ones are usually a fraction). */
    uint64_t arena = 0, f32_values = 0, low_lists = 0;
    for (size_t i = 0; i < ck->expected.count; i++) {
        const tensor_spec *s = &ck->expected.specs[i];
        if (s->expert >= 0) continue;
        arena += (tensor_spec_bytes(s) + 63) & ~(uint64_t)63;
        if (s->dtype == DTYPE_BF16 && s->ndim == 1) f32_values += (uint64_t)s->shape[0];
        const size_t name_len = strlen(s->name);
        if (s->dtype == DTYPE_F8_E4M3 && s->ndim == 2 && s->shape[1] <= FP8_LOW_CODES_MAX_COLS &&
            !(name_len >= 12 && strcmp(s->name + name_len - 12, ".wo_a.weight") == 0))
            low_lists += fp8_low_codes_bytes_bound((int)s->shape[0],
                                                   fp8_low_codes_limit((uint64_t)s->shape[0] * (uint64_t)s->shape[1]));
    }
    return arena + 64 + f32_values * sizeof(float) + low_lists;
}

static uint64_t compressor_bytes(int ratio, int dim, int context) {
    const uint64_t coff = ratio == 4 ? 2 : 1;
    const uint64_t rows = coff * (uint64_t)ratio, width = coff * (uint64_t)dim;
    return 2 * rows * width * sizeof(float) + ((uint64_t)context / (uint64_t)ratio + 1) * (uint64_t)dim * 2;
}

/* Decode state (the part that grows with the context). */
static uint64_t session_state_bytes(const model_config *c, int context) {
    uint64_t bytes = 0;
    const int n_blocks = config_total_blocks(c);
    for (int b = 0; b < n_blocks; b++) {
        bytes += (uint64_t)c->sliding_window * (uint64_t)c->head_dim * 2;
        const int ratio = c->compress_ratios[b];
        if (ratio) bytes += compressor_bytes(ratio, c->head_dim, context);
        if (ratio == 4) bytes += compressor_bytes(4, c->index_head_dim, context);
    }
    return bytes;
}

/* Scratch: session scratch, chunk buffers, the MoE workspace, last-position logits. */
static uint64_t session_work_bytes(const model_config *c, int context, int chunk, int mtp) {
    const uint64_t states = (uint64_t)chunk * (uint64_t)c->hc_mult * (uint64_t)c->hidden_size * sizeof(float);
    /* the arena as session.c allocates it, rounded up to its 64-byte alignment */
    const uint64_t arena = ((uint64_t)nn_session_scratch_bytes(c, chunk, context) + 63) & ~(uint64_t)63;
    uint64_t bytes = arena + 2 * states + moe_workspace_bytes(c, chunk) + (uint64_t)c->vocab_size * sizeof(float);
    if (mtp) bytes += (uint64_t)context * (uint64_t)c->hc_mult * (uint64_t)c->hidden_size * sizeof(float);
    return bytes;
}

uint64_t memory_plan_session_bytes(const model_config *c, int context, int chunk, int mtp) {
    return session_state_bytes(c, context) + session_work_bytes(c, context, chunk, mtp);
}

static void add_item(memory_plan *p, const char *name, uint64_t bytes, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void add_item(memory_plan *p, const char *name, uint64_t bytes, const char *fmt, ...) {
    memory_plan_item *it = &p->items[p->n_items++];
    snprintf(it->name, sizeof it->name, "%s", name);
    it->bytes = bytes;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(it->detail, sizeof it->detail, fmt, ap);
    va_end(ap);
    p->total_bytes += bytes;
}

int memory_plan_build(const checkpoint *ck, const memory_plan_request *req, memory_plan *p, ds4f_error *err) {
    const model_config *c = &ck->config;
    memset(p, 0, sizeof *p);
    if (req->context < 1 || req->chunk < 1 || req->sessions < 1 || req->slot_bytes == 0 || req->cache_slots < 0)
        return error_set(err, "memory plan: context, chunk, sessions and slot size must be positive");
    const int n_blocks = config_total_blocks(c);
    p->total_experts = n_blocks * c->n_routed_experts;
    p->slot_bytes = req->slot_bytes;
    /* One request needs one slot at a time at the least; a token's worth keeps the disk busy. */
    p->min_slots = c->num_experts_per_tok;
    if (req->budget_bytes) {
        p->budget_bytes = req->budget_bytes;
        snprintf(p->budget_source, sizeof p->budget_source, "--ram");
    } else {
        char source[64];
        const uint64_t avail = memory_available_bytes(source, sizeof source);
        if (!avail) return error_set(err, "cannot tell how much memory is available: give a budget (--ram)");
        p->budget_bytes = (uint64_t)(avail * MEMORY_PLAN_DEFAULT_FRACTION);
        snprintf(p->budget_source, sizeof p->budget_source, "%.0f%% of %.1f GiB available (%s)",
                 MEMORY_PLAN_DEFAULT_FRACTION * 100, (double)avail / GIB, source);
    }

    const uint64_t resident = memory_plan_resident_bytes(ck);
    add_item(p, "resident weights", resident, "attention, shared experts, router, embeddings, head");
    /* The tensor table and shard headers stay open with the model; measured at ~0.4 KB per
     * tensor. Policy scores and the slot map are per expert key. */
    const uint64_t tables = (uint64_t)ck->expected.count * 400 + (uint64_t)p->total_experts * (EXPERT_PARTS * 24 + 8 + 4);
    add_item(p, "model tables", tables, "%zu tensors, %d routed experts", ck->expected.count, p->total_experts);
    const uint64_t state = session_state_bytes(c, req->context) * (uint64_t)req->sessions;
    add_item(p, "decode state", state, "%d session%s x %d positions (window, compressed KV, indexer)", req->sessions,
             req->sessions == 1 ? "" : "s", req->context);
    const uint64_t work = session_work_bytes(c, req->context, req->chunk, req->mtp) * (uint64_t)req->sessions;
    add_item(p, "scratch", work, "chunk %d: activations, MoE workspace, logits%s", req->chunk, req->mtp ? ", MTP states" : "");
    p->session_bytes = memory_plan_session_bytes(c, req->context, req->chunk, req->mtp);
    p->sessions_reserved_bytes = state + work;
    int max_cols = c->hidden_size; /* the widest input of an FP8 or FP4 product */
    if (c->o_groups * c->o_lora_rank > max_cols) max_cols = c->o_groups * c->o_lora_rank;
    if (c->moe_intermediate_size > max_cols) max_cols = c->moe_intermediate_size;
    if (c->q_lora_rank > max_cols) max_cols = c->q_lora_rank;
    add_item(p, "kernel workspace", kernels_workspace_bytes(req->chunk, max_cols),
             "%s kernels, %d threads: activation forms of up to %d tokens x %d columns", kernels_selected(),
             kernels_threads(), req->chunk, max_cols);
    const uint64_t io = (uint64_t)req->io_threads * (256u << 10);
    add_item(p, "I/O", io, "%d threads; reads land in the cache slots (no bounce buffers)", req->io_threads);
    add_item(p, "runtime overhead", MEMORY_PLAN_RUNTIME_OVERHEAD_BYTES, "libraries, thread stacks, allocator slack");

    const uint64_t slot_total = req->slot_bytes + 160; /* data + slot record */
    const uint64_t fixed = p->total_bytes;
    int slots = req->cache_slots;
    if (!slots) {
        const uint64_t room = p->budget_bytes > fixed ? p->budget_bytes - fixed : 0;
        const uint64_t fit = room / slot_total;
        slots = fit > (uint64_t)p->total_experts ? p->total_experts : (int)fit;
    }
    p->cache_slots = slots;
    add_item(p, "expert cache", (uint64_t)slots * slot_total, "%d slots x %.2f MiB = %.0f%% of %d experts%s", slots,
             (double)req->slot_bytes / 1048576.0, 100.0 * slots / (p->total_experts ? p->total_experts : 1),
             p->total_experts, req->packed ? " (packed file)" : "");
    p->fits = 1;
    /* An explicit slot count is honoured down to 1 (a request then streams its experts one by
     * one); the planner itself never picks fewer than a token's worth. */
    if (req->cache_slots > 0) p->min_slots = 1;
    if (slots < p->min_slots) {
        p->fits = 0;
        snprintf(p->refusal, sizeof p->refusal,
                 "the memory plan leaves room for %d expert cache slot%s, a run needs at least %d: %.2f GiB are planned "
                 "besides the cache (resident weights %.2f GiB, decode state %.2f GiB) against a budget of %.2f GiB (%s)",
                 slots, slots == 1 ? "" : "s", p->min_slots, (double)fixed / GIB, (double)resident / GIB, (double)state / GIB,
                 (double)p->budget_bytes / GIB, p->budget_source);
    } else if (p->total_bytes > p->budget_bytes) {
        p->fits = 0;
        snprintf(p->refusal, sizeof p->refusal,
                 "the memory plan needs %.2f GiB (resident weights %.2f GiB, decode state %.2f GiB, expert cache %.2f GiB "
                 "for %d slots, other %.2f GiB) but the budget is %.2f GiB (%s); give fewer --cache-slots, a smaller --ctx "
                 "or a larger --ram",
                 (double)p->total_bytes / GIB, (double)resident / GIB, (double)state / GIB,
                 (double)slots * slot_total / GIB, slots, (double)(fixed - resident - state) / GIB,
                 (double)p->budget_bytes / GIB, p->budget_source);
    }
    return 0;
}

void memory_plan_print(const memory_plan *p, FILE *out) {
    fprintf(out, "memory plan (budget %.2f GiB: %s)\n", (double)p->budget_bytes / GIB, p->budget_source);
    for (int i = 0; i < p->n_items; i++)
        fprintf(out, "  %-18s %9.3f GiB  %s\n", p->items[i].name, (double)p->items[i].bytes / GIB, p->items[i].detail);
    fprintf(out, "  %-18s %9.3f GiB  %s\n", "total", (double)p->total_bytes / GIB,
            p->fits ? "fits" : "DOES NOT FIT");
    if (!p->fits) fprintf(out, "  %s\n", p->refusal);
}

static uint64_t read_u64_file(const char *path) {
    char *text;
    size_t len;
    ds4f_error ignored;
    if (file_read_all(path, &text, &len, &ignored) != 0) return 0;
    uint64_t v = 0;
    if (!strncmp(text, "max", 3)) v = UINT64_MAX;
    else v = strtoull(text, NULL, 10);
    free(text);
    return v;
}

/* The memory controller's limit on this process's cgroup (v1 memory.limit_in_bytes or v2
 * memory.max); 0 if none. */
static uint64_t cgroup_limit_bytes(void) {
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) return 0;
    char line[1024];
    uint64_t limit = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char path[1200];
        const char *v1 = strstr(line, ":memory:");
        if (v1) {
            snprintf(path, sizeof path, "/sys/fs/cgroup/memory%s/memory.limit_in_bytes", v1 + 8);
        } else if (!strncmp(line, "0::", 3)) {
            snprintf(path, sizeof path, "/sys/fs/cgroup%s/memory.max", line + 3);
        } else {
            continue;
        }
        uint64_t v = read_u64_file(path);
        if (v && v < (1ull << 60) && (!limit || v < limit)) limit = v;
    }
    fclose(f);
    return limit;
}

uint64_t memory_available_bytes(char *source, size_t source_size) {
    uint64_t avail = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f)) {
            unsigned long long kb;
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) avail = (uint64_t)kb * 1024;
        }
        fclose(f);
    }
    const char *what = "MemAvailable";
    if (!avail) {
        const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        if (pages > 0 && page > 0) avail = (uint64_t)pages * (uint64_t)page;
        what = "physical memory";
    }
    const uint64_t limit = cgroup_limit_bytes();
    if (limit && (!avail || limit < avail)) {
        avail = limit;
        what = "cgroup memory limit";
    }
    if (source) snprintf(source, source_size, "%s", what);
    return avail;
}

uint64_t memory_peak_rss_bytes(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
#ifdef __APPLE__
    return (uint64_t)ru.ru_maxrss; /* bytes on macOS */
#else
    return (uint64_t)ru.ru_maxrss * 1024; /* kilobytes on Linux: VmHWM */
#endif
}

uint64_t memory_parse_size(const char *text) {
    if (!text || !*text) return 0;
    char *end;
    const double v = strtod(text, &end);
    if (end == text || !(v > 0) || !isfinite(v)) return 0;
    double mul = 1;
    switch (tolower((unsigned char)*end)) {
    case 0: mul = 1; break;
    case 'k': mul = 1024.0; end++; break;
    case 'm': mul = 1024.0 * 1024; end++; break;
    case 'g': mul = 1024.0 * 1024 * 1024; end++; break;
    case 't': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: return 0;
    }
    if (*end == 'i' || *end == 'I') end++;
    if (*end == 'b' || *end == 'B') end++;
    if (*end) return 0;
    const double bytes = v * mul;
    return bytes >= 1.8e19 ? 0 : (uint64_t)bytes;
}
