/* The persistent thread pool and the row-split forms of the products.
 *
 * Workers live for the whole process. A job is published by bumping a generation counter; workers
 * spin briefly on it (decode runs hundreds of short parallel products per token, and waking a
 * sleeping thread costs more than most of them), then sleep on a condition variable. Tasks are
 * handed out through an atomic counter, the calling thread takes its share, and nothing is
 * allocated per job. */
#include "kernels/kernels_internal.h"
#include "kernels/plain_c_targets.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ volatile("yield")
#else
#define cpu_relax() ((void)0)
#endif
#if defined(__APPLE__)
#include <sys/sysctl.h>
#endif

/* About 50-100 microseconds of spinning before a worker sleeps. */
#define SPIN_ITERATIONS 20000

typedef struct pool {
    int n_threads; /* including the caller */
    pthread_t *workers;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    atomic_uint generation;
    atomic_int stop;
    /* The current job. `claim` packs (job generation << 32 | n_tasks << 16 | next task): a worker
     * takes a task only with a compare-and-swap that also checks the generation, so a worker that
     * wakes up late can never take a task of a newer job, and the caller waits only for the tasks
     * actually taken (a worker the OS has not scheduled yet holds nobody up). */
    kernels_task_fn fn;
    void *ctx;
    _Atomic unsigned long long claim;
    atomic_int finished;
} pool;

static pool the_pool;
static int pool_started;
static _Thread_local int inside_task;
static _Thread_local int thread_index; /* 0 outside the pool's workers */

int kernels_thread_index(void) { return thread_index; }

/* Takes and runs tasks of job `gen` until none is left; returns how many it ran. */
static void run_tasks(pool *p, unsigned gen) {
    for (;;) {
        unsigned long long c = atomic_load_explicit(&p->claim, memory_order_acquire);
        for (;;) {
            if ((unsigned)(c >> 32) != gen) return;
            const unsigned n = (unsigned)(c >> 16) & 0xffff, next = (unsigned)c & 0xffff;
            if (next >= n) return;
            if (atomic_compare_exchange_weak_explicit(&p->claim, &c, c + 1, memory_order_acq_rel, memory_order_acquire))
                break;
        }
        /* the job cannot end before this task is finished, so fn and ctx are still its own */
        p->fn(p->ctx, (int)(c & 0xffff));
        atomic_fetch_add_explicit(&p->finished, 1, memory_order_release);
    }
}

/* arg: the worker's index (1 .. n_threads - 1); the pool is the one pool. */
static void *worker_main(void *arg) {
    pool *p = &the_pool;
    thread_index = (int)(intptr_t)arg;
    inside_task = 1;
    /* The generation the pool started with, not the current one: a job may be published before
     * this thread first runs, and it may still help with it. */
    unsigned seen = 0;
    for (;;) {
        unsigned g = seen;
        for (int i = 0; i < SPIN_ITERATIONS && g == seen; i++) {
            cpu_relax();
            g = atomic_load_explicit(&p->generation, memory_order_acquire);
        }
        if (g == seen) {
            pthread_mutex_lock(&p->lock);
            while ((g = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen &&
                   !atomic_load(&p->stop))
                pthread_cond_wait(&p->wake, &p->lock);
            pthread_mutex_unlock(&p->lock);
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = g;
        run_tasks(p, g);
    }
}

static void pool_stop(pool *p) {
    if (!pool_started) return;
    pthread_mutex_lock(&p->lock);
    atomic_store(&p->stop, 1);
    atomic_fetch_add(&p->generation, 1);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < p->n_threads - 1; i++) pthread_join(p->workers[i], NULL);
    free(p->workers);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->wake);
    pool_started = 0;
}

static int pool_start(pool *p, int n) {
    memset(p, 0, sizeof *p);
    p->n_threads = n;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    p->workers = calloc((size_t)(n > 1 ? n - 1 : 1), sizeof *p->workers);
    if (!p->workers) return -1;
    pool_started = 1;
    for (int i = 0; i < n - 1; i++)
        if (pthread_create(&p->workers[i], NULL, worker_main, (void *)(intptr_t)(i + 1)) != 0) {
            p->n_threads = i + 1;
            pool_stop(p);
            return -1;
        }
    return 0;
}

/* Physical cores: distinct (package, core) pairs in sysfs; online CPUs when that is unreadable. */
int kernels_default_threads(void) {
#if defined(__APPLE__)
    int n = 0;
    size_t len = sizeof n;
    if (sysctlbyname("hw.physicalcpu", &n, &len, NULL, 0) == 0 && n > 0) return n;
#endif
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (online < 1) online = 1;
    int pairs[1024][2], n_pairs = 0;
    for (long cpu = 0; cpu < online && cpu < 1024; cpu++) {
        char path[128];
        int pkg = -1, core = -1;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%ld/topology/physical_package_id", cpu);
        FILE *f = fopen(path, "r");
        if (!f) return (int)online;
        if (fscanf(f, "%d", &pkg) != 1) pkg = -1;
        fclose(f);
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%ld/topology/core_id", cpu);
        f = fopen(path, "r");
        if (!f) return (int)online;
        if (fscanf(f, "%d", &core) != 1) core = -1;
        fclose(f);
        int seen = 0;
        for (int i = 0; i < n_pairs && !seen; i++) seen = pairs[i][0] == pkg && pairs[i][1] == core;
        if (!seen) {
            pairs[n_pairs][0] = pkg;
            pairs[n_pairs][1] = core;
            n_pairs++;
        }
    }
    return n_pairs > 0 ? n_pairs : (int)online;
}

int kernels_set_threads(int n) {
    if (n <= 0) n = kernels_default_threads();
    if (n > 256) n = 256;
    if (pool_started && the_pool.n_threads == n) return 0;
    pool_stop(&the_pool);
    return pool_start(&the_pool, n);
}

int kernels_threads(void) {
    if (!pool_started) kernels_set_threads(0);
    return pool_started ? the_pool.n_threads : 1;
}

void kernels_parallel_for(kernels_task_fn fn, void *ctx, int n_tasks) {
    if (n_tasks <= 0) return;
    if (!pool_started) kernels_set_threads(0);
    pool *p = &the_pool;
    if (inside_task || !pool_started || p->n_threads == 1 || n_tasks == 1 || n_tasks > 0xffff) {
        for (int t = 0; t < n_tasks; t++) fn(ctx, t);
        return;
    }
    const unsigned gen = atomic_load_explicit(&p->generation, memory_order_relaxed) + 1;
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->finished, 0, memory_order_relaxed);
    atomic_store_explicit(&p->claim, (unsigned long long)gen << 32 | (unsigned long long)n_tasks << 16,
                          memory_order_release);
    pthread_mutex_lock(&p->lock);
    atomic_store_explicit(&p->generation, gen, memory_order_release);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    inside_task = 1;
    run_tasks(p, gen);
    inside_task = 0;
    while (atomic_load_explicit(&p->finished, memory_order_acquire) != n_tasks) cpu_relax();
}

typedef struct rows_job {
    kernels_rows_fn fn;
    void *ctx;
    int n, per;
} rows_job;

static void rows_task(void *ctx, int task) {
    const rows_job *j = ctx;
    const int begin = task * j->per, end = begin + j->per < j->n ? begin + j->per : j->n;
    j->fn(j->ctx, begin, end);
}

void kernels_parallel_rows(kernels_rows_fn fn, void *ctx, int n) {
    if (n <= 0) return;
    const int threads = kernels_threads();
    if (n == 1 || threads <= 1 || inside_task) {
        fn(ctx, 0, n);
        return;
    }
    /* a few ranges per thread, as the products do, so that one slowed thread holds nobody up */
    const int wanted = threads * 4 < n ? threads * 4 : n;
    rows_job j = {fn, ctx, n, (n + wanted - 1) / wanted};
    kernels_parallel_for(rows_task, &j, (n + j.per - 1) / j.per);
}

void kernels_parallel_light_rows(kernels_rows_fn fn, void *ctx, int n) {
    if (n >= KERNELS_LIGHT_ROWS_MIN)
        kernels_parallel_rows(fn, ctx, n);
    else if (n > 0)
        fn(ctx, 0, n);
}

typedef struct quantize_rows_job {
    const float *x;
    int x_stride, cols;
    uint8_t *codes;
    float *scales;
} quantize_rows_job;

static void quantize_rows(void *ctx, int begin, int end) {
    const quantize_rows_job *j = ctx;
    for (int t = begin; t < end; t++)
        quantize_fp8_act(j->x + (size_t)t * j->x_stride, j->cols, j->codes + (size_t)t * j->cols,
                         j->scales + (size_t)t * (j->cols / FP8_ACT_BLOCK));
}

void par_quantize_fp8_act(const float *x, int x_stride, int cols, int n, uint8_t *codes, float *scales) {
    quantize_rows_job j = {x, x_stride, cols, codes, scales};
    kernels_parallel_rows(quantize_rows, &j, n);
}

typedef struct round_rows_job {
    float *y;
    int y_stride, cols;
} round_rows_job;

/* bf16 rounding of n rows of cols values (the bf16 outputs of products, a chunk's tokens): plain C
 * compiled per vector level. */
static inline __attribute__((always_inline)) void round_bf16_rows_body(float *y, int y_stride, int cols, int n) {
    for (int t = 0; t < n; t++) bf16_round_array(y + (size_t)t * y_stride, (size_t)cols);
}
PLAIN_C_TARGETS(round_bf16_rows, (float *y, int y_stride, int cols, int n), (y, y_stride, cols, n))

static void round_rows(void *ctx, int begin, int end) {
    const round_rows_job *j = ctx;
    PLAIN_C_TARGETS_CALL(round_bf16_rows, (j->y + (size_t)begin * j->y_stride, j->y_stride, j->cols, end - begin));
}

void par_round_bf16(float *y, int y_stride, int cols, int n) {
    round_rows_job j = {y, y_stride, cols};
    kernels_parallel_rows(round_rows, &j, n);
}

/* --- row-split products --- */

/* Row tasks of a guided split (run_rows): at most this many per product. */
#define ROW_TASKS_MAX 48

typedef enum { JOB_FP8, JOB_FP4, JOB_FP8_DEQUANT, JOB_BF16, JOB_F32, JOB_FP8_PREPARED, JOB_FP4_PREPARED } job_kind;

typedef struct row_job {
    job_kind kind;
    const void *w;
    const void *act;
    const uint8_t *x_codes;
    const float *x_scales, *x;
    int x_stride, n_tokens, y_stride;
    float *y;
    int row_begin, row_end;
    int round_bf16; /* y rounded to bf16 after the product */
    unsigned long long call_id;
    int tokens_per_task; /* > 0: the tasks split the tokens instead of the rows */
    int task_rows[ROW_TASKS_MAX + 1]; /* row task i covers row_begin + task_rows[i] .. row_begin + task_rows[i + 1] */
} row_job;

static _Thread_local unsigned long long current_call_id;
static atomic_ullong next_call_id;

unsigned long long kernel_call_id(void) { return current_call_id; }

/* Every row of the float products for the tokens [t0, t1) of a token-split job. */
static void token_task(const row_job *j, int task) {
    const int t0 = task * j->tokens_per_task;
    const int t1 = t0 + j->tokens_per_task < j->n_tokens ? t0 + j->tokens_per_task : j->n_tokens;
    const kernel_ops *k = &kernels_current;
    const float *x = j->x + (size_t)t0 * j->x_stride;
    float *y = j->y + (size_t)t0 * j->y_stride;
    switch (j->kind) {
    case JOB_FP8_DEQUANT: k->matmul_fp8_dequant(j->w, x, j->x_stride, t1 - t0, y, j->y_stride, j->row_begin, j->row_end); break;
    case JOB_BF16: k->matmul_bf16(j->w, x, j->x_stride, t1 - t0, y, j->y_stride, j->row_begin, j->row_end); break;
    case JOB_F32: k->matmul_f32(j->w, x, j->x_stride, t1 - t0, y, j->y_stride, j->row_begin, j->row_end); break;
    default: break;
    }
}

static void row_task(void *ctx, int task) {
    const row_job *j = ctx;
    if (j->tokens_per_task) {
        token_task(j, task);
        return;
    }
    const int r0 = j->row_begin + j->task_rows[task], r1 = j->row_begin + j->task_rows[task + 1];
    const kernel_ops *k = &kernels_current;
    current_call_id = j->call_id;
    switch (j->kind) {
    case JOB_FP8: k->matmul_fp8(j->w, j->x_codes, j->x_scales, j->n_tokens, j->y, j->y_stride, r0, r1); break;
    case JOB_FP4: k->matmul_fp4(j->w, j->x_codes, j->x_scales, j->n_tokens, j->y, j->y_stride, r0, r1); break;
    case JOB_FP8_DEQUANT: k->matmul_fp8_dequant(j->w, j->x, j->x_stride, j->n_tokens, j->y, j->y_stride, r0, r1); break;
    case JOB_BF16: k->matmul_bf16(j->w, j->x, j->x_stride, j->n_tokens, j->y, j->y_stride, r0, r1); break;
    case JOB_F32: k->matmul_f32(j->w, j->x, j->x_stride, j->n_tokens, j->y, j->y_stride, r0, r1); break;
    case JOB_FP8_PREPARED: k->matmul_fp8_prepared(j->w, j->act, j->x_scales, j->n_tokens, j->y, j->y_stride, r0, r1); break;
    case JOB_FP4_PREPARED: k->matmul_fp4_prepared(j->w, j->act, j->x_scales, j->n_tokens, j->y, j->y_stride, r0, r1); break;
    }
    current_call_id = 0;
    if (j->round_bf16) PLAIN_C_TARGETS_CALL(round_bf16_rows, (j->y + r0, j->y_stride, r1 - r0, j->n_tokens));
}

/* Splits [row_begin, row_end) into tasks of whole 16-row groups (the SIMD tile height), shrinking
 * toward the end (below), so a thread slowed by another process does not hold the others up.
 * Products too small to pay for waking the pool run on the caller. Each task's rows stay one
 * contiguous run: many small tasks from the start, the threads taking turns, were much slower
 * from RAM (par_matmul_fp8 4096 x 4096, one token, 2 threads: 16 equal tasks per thread 0.64 ms,
 * 4 per thread 0.37). */
static void run_rows(row_job *j, int cols) {
    const int rows = j->row_end - j->row_begin;
    if (rows <= 0) return;
    const int threads = kernels_threads();
    j->call_id = atomic_fetch_add_explicit(&next_call_id, 1, memory_order_relaxed) + 1;
    const double work = (double)rows * cols * j->n_tokens;
    /* inside a pool task the calling thread runs every task itself: one call over all the rows
     * (a kernel that prepares its own activation form does so once) */
    const int tasks = threads <= 1 || work < 65536.0 || inside_task ? 1 : threads * 4;
    /* A float product with too few rows to give every thread a share (the hyper-connection mixes:
     * 24 rows) splits its tokens instead: each output is computed by the same code either way. */
    const int float_kind = j->kind == JOB_F32 || j->kind == JOB_BF16 || j->kind == JOB_FP8_DEQUANT;
    if (tasks > 1 && float_kind && rows < 32 * threads && j->n_tokens >= 2 * threads) {
        const int token_tasks = j->n_tokens < threads * 4 ? j->n_tokens : threads * 4;
        j->tokens_per_task = (j->n_tokens + token_tasks - 1) / token_tasks;
        kernels_parallel_for(row_task, j, (j->n_tokens + j->tokens_per_task - 1) / j->tokens_per_task);
        return;
    }
    j->task_rows[0] = 0;
    if (tasks == 1 || rows <= 16) {
        j->task_rows[1] = rows;
        row_task(j, 0);
        return;
    }
    /* Guided split: each task takes 1 / (2 threads) of the rows left, in whole 16-row groups, so
     * the tasks shrink toward the end and the threads finish within a small task of each other
     * (equal tasks left a thread waiting half a task at the end of every product). */
    int n = 0, done = 0;
    while (done < rows) {
        int size = (rows - done + 2 * threads - 1) / (2 * threads);
        size = (size + 15) & ~15;
        if (size > rows - done || n == ROW_TASKS_MAX - 1) size = rows - done;
        done += size;
        j->task_rows[++n] = done;
    }
    kernels_parallel_for(row_task, j, n);
}

/* The shared activation forms of the FP8/FP4 products: one buffer, used by one product at a time
 * (products called from inside a pool task run alone and prepare their own). */
static void *shared_act;
static size_t shared_act_bytes;

size_t kernels_workspace_bytes(int max_tokens, int max_cols) {
    const kernel_ops *k = &kernels_current;
    /* the forms grow with the token count; the counts below also cover each variant's switch
     * between its few-token and many-token forms */
    const int counts[] = {1, 2, 3, 4, 5, 8, 16, max_tokens};
    size_t form = 0;
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        const int n = counts[i];
        if (n < 1 || n > max_tokens) continue;
        const size_t f8 = k->fp8_act_bytes ? k->fp8_act_bytes(n, max_cols) : 0;
        const size_t f4 = k->fp4_act_bytes ? k->fp4_act_bytes(n, max_cols) : 0;
        if (f8 > form) form = f8;
        if (f4 > form) form = f4;
    }
    const size_t shared = (form + 65535) & ~(size_t)65535;
    /* a product run inside a pool task prepares its own form (FP4: task_act; FP8: the kernel's
     * own scratch, counted as the second form); tiles, sums, the FP8 decode's low-code excess
     * table and its 8 rows of block products (32 bytes per 128 columns each): at most 64 KB, plus 2 KB of accumulators
     * per 16 tokens (the AMX FP4 rows: two 16-row groups of 1 KB tiles) */
    const size_t per_thread = 2 * ((form + 4095) & ~(size_t)4095) + (64u << 10) + (size_t)((max_tokens + 15) / 16) * 2048;
    return shared + (size_t)kernels_threads() * per_thread;
}

/* Inside a pool task (decode's routed experts, one thread each) the shared form belongs to no one
 * product, so each thread prepares into its own: an expert's w1 and w3 still share one
 * preparation, and each product is prepared once, not once per row task. */
static _Thread_local kernel_scratch task_act;

static void *shared_act_get(size_t bytes) {
    if (bytes > shared_act_bytes) {
        free(shared_act);
        shared_act_bytes = (bytes + 65535) & ~(size_t)65535;
        shared_act = aligned_alloc(64, shared_act_bytes);
        if (!shared_act) {
            shared_act_bytes = 0;
            return NULL;
        }
    }
    return shared_act;
}

static void fp8_rows(const fp8_matrix *w, const uint8_t *x_codes, const float *x_scales, int n_tokens, float *y,
                     int y_stride, int row_begin, int row_end, int round_bf16) {
    row_job j = {JOB_FP8, w, NULL, x_codes, x_scales, NULL, 0, n_tokens, y_stride, y, row_begin, row_end, round_bf16, 0, 0, {0}};
    const kernel_ops *k = &kernels_current;
    if (k->matmul_fp8_prepared && !inside_task && row_end > row_begin && n_tokens > 0) {
        void *act = shared_act_get(k->fp8_act_bytes(n_tokens, w->cols));
        if (act) {
            k->fp8_act_prepare(x_codes, x_scales, n_tokens, w->cols, act);
            j.kind = JOB_FP8_PREPARED;
            j.act = act;
        }
    }
    run_rows(&j, w->cols);
}

void par_matmul_fp8(const fp8_matrix *w, const uint8_t *x_codes, const float *x_scales, int n_tokens, float *y,
                    int y_stride, int row_begin, int row_end) {
    fp8_rows(w, x_codes, x_scales, n_tokens, y, y_stride, row_begin, row_end, 0);
}

void par_matmul_fp8_bf16(const fp8_matrix *w, const uint8_t *x_codes, const float *x_scales, int n_tokens, float *y,
                         int y_stride, int row_begin, int row_end) {
    fp8_rows(w, x_codes, x_scales, n_tokens, y, y_stride, row_begin, row_end, 1);
}

/* The activation form of an FP4 product of n_tokens x cols, prepared: shared by the threads, or
 * the calling thread's own inside a pool task; NULL where the variant has none (the kernel then
 * prepares its own). */
static void *fp4_act_shared(const uint8_t *x_codes, const float *x_scales, int n_tokens, int cols) {
    const kernel_ops *k = &kernels_current;
    if (!k->matmul_fp4_prepared || n_tokens <= 0) return NULL;
    const size_t bytes = k->fp4_act_bytes(n_tokens, cols);
    void *act = inside_task ? kernel_scratch_get(&task_act, bytes) : shared_act_get(bytes);
    if (act) k->fp4_act_prepare(x_codes, x_scales, n_tokens, cols, act);
    return act;
}

static void fp4_rows(const fp4_matrix *w, const void *act, const uint8_t *x_codes, const float *x_scales, int n_tokens,
                     float *y, int y_stride, int row_begin, int row_end) {
    row_job j = {act ? JOB_FP4_PREPARED : JOB_FP4, w, act, x_codes, x_scales, NULL, 0, n_tokens, y_stride, y, row_begin,
                 row_end, 0, 0, 0, {0}};
    run_rows(&j, w->cols);
}

void par_matmul_fp4(const fp4_matrix *w, const uint8_t *x_codes, const float *x_scales, int n_tokens, float *y,
                    int y_stride, int row_begin, int row_end) {
    const void *act = row_end > row_begin ? fp4_act_shared(x_codes, x_scales, n_tokens, w->cols) : NULL;
    fp4_rows(w, act, x_codes, x_scales, n_tokens, y, y_stride, row_begin, row_end);
}

void par_matmul_fp4_pair(const fp4_matrix *wa, const fp4_matrix *wb, const uint8_t *x_codes, const float *x_scales,
                         int n_tokens, float *ya, float *yb, int y_stride) {
    const void *act = fp4_act_shared(x_codes, x_scales, n_tokens, wa->cols);
    fp4_rows(wa, act, x_codes, x_scales, n_tokens, ya, y_stride, 0, wa->rows);
    fp4_rows(wb, act, x_codes, x_scales, n_tokens, yb, y_stride, 0, wb->rows);
}

void par_matmul_fp8_dequant(const fp8_matrix *w, const float *x, int x_stride, int n_tokens, float *y, int y_stride,
                            int row_begin, int row_end) {
    row_job j = {JOB_FP8_DEQUANT, w, NULL, NULL, NULL, x, x_stride, n_tokens, y_stride, y, row_begin, row_end, 0, 0, 0, {0}};
    run_rows(&j, w->cols);
}

void par_matmul_bf16(const bf16_matrix *w, const float *x, int x_stride, int n_tokens, float *y, int y_stride,
                     int row_begin, int row_end) {
    row_job j = {JOB_BF16, w, NULL, NULL, NULL, x, x_stride, n_tokens, y_stride, y, row_begin, row_end, 0, 0, 0, {0}};
    run_rows(&j, w->cols);
}

void par_matmul_f32(const f32_matrix *w, const float *x, int x_stride, int n_tokens, float *y, int y_stride,
                    int row_begin, int row_end) {
    row_job j = {JOB_F32, w, NULL, NULL, NULL, x, x_stride, n_tokens, y_stride, y, row_begin, row_end, 0, 0, 0, {0}};
    run_rows(&j, w->cols);
}
