#include "stream/io_pool.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static ssize_t system_pread(void *ctx, int fd, void *dst, size_t bytes, uint64_t offset) {
    (void)ctx;
    return pread(fd, dst, bytes, (off_t)offset);
}

const io_ops io_ops_system = {NULL, system_pread};

typedef struct job_queue {
    io_job *head, *tail;
} job_queue;

struct io_pool {
    pthread_mutex_t lock;
    pthread_cond_t work;      /* a chunk may be available, or stopping */
    pthread_cond_t idle;      /* a job finished (destroy waits for all) */
    job_queue queue[2];       /* IO_DEMAND, IO_SPECULATIVE */
    int jobs_outstanding;     /* submitted, done() not yet returned */
    int speculative_in_flight, max_speculative_chunks;
    int stopping;
    uint64_t chunk_bytes;
    io_ops ops;
    int n_threads;
    pthread_t *threads;
    io_pool_stats stats;
};

static void queue_push(job_queue *q, io_job *j) {
    j->next = NULL;
    j->prev = q->tail;
    if (q->tail) q->tail->next = j;
    else q->head = j;
    q->tail = j;
    j->queued = 1;
}

static void queue_remove(job_queue *q, io_job *j) {
    if (j->prev) j->prev->next = j->next;
    else q->head = j->next;
    if (j->next) j->next->prev = j->prev;
    else q->tail = j->prev;
    j->prev = j->next = NULL;
    j->queued = 0;
}

/* Reads one chunk: [offset, offset + bytes) of segment s. Only the first `needed` bytes must
 * arrive (the rest may lie past the end of the file). Direct I/O needs every pread aligned, so a
 * partial transfer that is not a multiple of IO_ALIGN ends the chunk: if the needed bytes are not
 * all there by then, the chunk failed. */
static int read_chunk(const io_ops *ops, const io_segment *s, uint64_t offset, uint64_t bytes, uint64_t needed,
                      ds4f_error *err) {
    uint64_t got = 0;
    while (got < bytes) {
        ssize_t n = ops->pread(ops->ctx, s->fd, s->dst + offset + got, (size_t)(bytes - got), s->offset + offset + got);
        if (n < 0) {
            if (errno == EINTR) continue;
            return error_set(err, "%s: read of %llu bytes at offset %llu failed: %s", s->path,
                             (unsigned long long)(bytes - got), (unsigned long long)(s->offset + offset + got),
                             strerror(errno));
        }
        if (n == 0) break;
        got += (uint64_t)n;
        if (got < bytes && got % IO_ALIGN) break;
    }
    if (got < needed)
        return error_set(err, "%s: short read at offset %llu: wanted %llu bytes, got %llu", s->path,
                         (unsigned long long)(s->offset + offset), (unsigned long long)needed, (unsigned long long)got);
    return 0;
}

static int job_has_chunks(const io_job *j) { return j->cursor_segment < j->n_segments; }

static void *worker_main(void *arg) {
    io_pool *p = arg;
    pthread_mutex_lock(&p->lock);
    for (;;) {
        io_job *job = p->queue[IO_DEMAND].head;
        int speculative = 0;
        if (!job && p->speculative_in_flight < p->max_speculative_chunks) {
            job = p->queue[IO_SPECULATIVE].head;
            speculative = job != NULL;
        }
        if (!job) {
            if (p->stopping) break;
            pthread_cond_wait(&p->work, &p->lock);
            continue;
        }
        /* Take the next chunk of this job; a job leaves its queue once every chunk is issued. */
        const int seg_index = job->cursor_segment;
        const io_segment *s = &job->seg[seg_index];
        const uint64_t offset = job->cursor_offset;
        const uint64_t bytes = s->bytes - offset < p->chunk_bytes ? s->bytes - offset : p->chunk_bytes;
        const uint64_t needed = s->needed_bytes > offset ? (s->needed_bytes - offset < bytes ? s->needed_bytes - offset : bytes) : 0;
        job->cursor_offset += bytes;
        if (job->cursor_offset >= s->bytes) {
            job->cursor_segment++;
            job->cursor_offset = 0;
        }
        if (!job_has_chunks(job)) queue_remove(&p->queue[job->priority], job);
        job->chunks_in_flight++;
        if (speculative) p->speculative_in_flight++;
        const int skip = job->failed; /* an earlier chunk failed: the job's data is void anyway */
        pthread_mutex_unlock(&p->lock);

        ds4f_error chunk_err;
        int rc = skip ? 0 : read_chunk(&p->ops, s, offset, bytes, needed, &chunk_err);

        pthread_mutex_lock(&p->lock);
        if (speculative) {
            p->speculative_in_flight--;
            p->stats.speculative_chunks++;
        }
        p->stats.chunks++;
        if (rc != 0 && !job->failed) {
            job->failed = 1;
            job->err = chunk_err;
        }
        if (rc == 0 && !skip) {
            job->bytes_read += bytes;
            p->stats.bytes_read += bytes;
        }
        job->chunks_in_flight--;
        if (!job_has_chunks(job) && job->chunks_in_flight == 0) {
            if (job->failed) p->stats.jobs_failed++;
            p->stats.jobs_done++;
            pthread_mutex_unlock(&p->lock);
            job->done(job->done_ctx, job);
            pthread_mutex_lock(&p->lock);
            p->jobs_outstanding--;
            pthread_cond_broadcast(&p->idle);
        }
        /* A speculative chunk slot freed up: another worker may be waiting for it. */
        if (speculative && p->queue[IO_SPECULATIVE].head) pthread_cond_signal(&p->work);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

int io_pool_create(int threads, uint64_t chunk_bytes, const io_ops *ops, io_pool **out, ds4f_error *err) {
    if (threads < 1 || threads > 256) return error_set(err, "I/O threads must be 1..256, not %d", threads);
    if (chunk_bytes < IO_ALIGN || chunk_bytes % IO_ALIGN)
        return error_set(err, "I/O chunk of %llu bytes is not a multiple of %u", (unsigned long long)chunk_bytes, IO_ALIGN);
    io_pool *p = calloc(1, sizeof *p);
    if (!p) return error_set(err, "out of memory");
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->idle, NULL);
    p->chunk_bytes = chunk_bytes;
    p->ops = ops ? *ops : io_ops_system;
    /* Speculative reads are most of the bytes (prefetch keeps the disk busy between demands), so
     * they may use every worker but one: the one kept free starts a demand chunk at once, and
     * the others finish their chunk (at most chunk_bytes) before taking the demand's next. */
    p->max_speculative_chunks = threads > 1 ? threads - 1 : 1;
    p->threads = calloc((size_t)threads, sizeof *p->threads);
    if (!p->threads) {
        free(p);
        return error_set(err, "out of memory");
    }
    for (int i = 0; i < threads; i++) {
        /* The workers only copy from the kernel: a small stack is plenty. */
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, 256 * 1024);
        int rc = pthread_create(&p->threads[i], &attr, worker_main, p);
        pthread_attr_destroy(&attr);
        if (rc != 0) {
            io_pool_destroy(p);
            return error_set(err, "cannot start I/O thread %d: %s", i, strerror(rc));
        }
        p->n_threads++;
    }
    *out = p;
    return 0;
}

void io_pool_destroy(io_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    while (p->jobs_outstanding > 0) pthread_cond_wait(&p->idle, &p->lock);
    p->stopping = 1;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->idle);
    free(p->threads);
    free(p);
}

void io_pool_submit(io_pool *p, io_job *job) {
    job->failed = 0;
    job->bytes_read = 0;
    job->cursor_segment = 0;
    job->cursor_offset = 0;
    job->chunks_in_flight = 0;
    /* Empty segments would never produce a chunk, hence never a done(): drop them. */
    int kept = 0;
    for (int i = 0; i < job->n_segments; i++)
        if (job->seg[i].bytes) job->seg[kept++] = job->seg[i];
    job->n_segments = kept;
    if (kept == 0) {
        job->done(job->done_ctx, job);
        return;
    }
    pthread_mutex_lock(&p->lock);
    p->jobs_outstanding++;
    queue_push(&p->queue[job->priority], job);
    if (job->priority == IO_DEMAND) pthread_cond_broadcast(&p->work);
    else pthread_cond_signal(&p->work);
    pthread_mutex_unlock(&p->lock);
}

void io_pool_promote(io_pool *p, io_job *job) {
    pthread_mutex_lock(&p->lock);
    if (job->priority == IO_SPECULATIVE) {
        if (job->queued) {
            queue_remove(&p->queue[IO_SPECULATIVE], job);
            queue_push(&p->queue[IO_DEMAND], job);
            pthread_cond_broadcast(&p->work);
        }
        job->priority = IO_DEMAND;
        p->stats.promotions++;
    }
    pthread_mutex_unlock(&p->lock);
}

void io_pool_get_stats(io_pool *p, io_pool_stats *out) {
    pthread_mutex_lock(&p->lock);
    *out = p->stats;
    pthread_mutex_unlock(&p->lock);
}

int io_pool_threads(const io_pool *p) { return p->n_threads; }
