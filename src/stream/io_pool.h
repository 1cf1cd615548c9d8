/* Parallel positional reads on a small pool of I/O threads.
 *
 * A job reads up to IO_JOB_MAX_SEGMENTS byte ranges (one routed expert: its parts grouped by
 * where they lie on disk) into caller-owned memory. Workers take the jobs' ranges in chunks of
 * chunk_bytes, so several workers share one big job (queue depth without more jobs) and a demand
 * job that arrives waits for at most one chunk per worker, never for a whole speculative job.
 *
 * Scheduling invariants:
 *  - Demand before speculative: a worker takes a speculative chunk only while no demand job has
 *    a chunk left to issue, and at most threads - 1 speculative chunks are in flight, so a
 *    demand read always finds a worker free the moment it arrives and takes every worker as
 *    soon as their current chunk is done.
 *  - Within a priority, jobs issue in submission order (callers submit in file-offset order).
 *  - A job's done() runs exactly once, on a worker, after its last chunk finished; failed is set
 *    if any chunk failed or came back short, with the first error (file and offset) in err.
 *
 * All reads go through an io_ops table: the system pread, or a test's, which injects short reads
 * and errors to prove that no half-read expert is ever used. */
#ifndef DS4F_STREAM_IO_POOL_H
#define DS4F_STREAM_IO_POOL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/error.h"

/* Alignment of offsets, lengths and buffers for direct I/O (the largest logical block size in
 * common use; 512-byte devices accept it too). */
#define IO_ALIGN 4096u
#define IO_JOB_MAX_SEGMENTS 6

typedef struct io_ops {
    void *ctx;
    /* pread(2) semantics: bytes read, 0 at end of file, -1 with errno set. */
    ssize_t (*pread)(void *ctx, int fd, void *dst, size_t bytes, uint64_t offset);
} io_ops;

/* The system's pread. */
extern const io_ops io_ops_system;

typedef struct io_segment {
    int fd;
    const char *path;     /* for messages */
    uint64_t offset;      /* first byte read */
    uint64_t bytes;       /* bytes asked for */
    uint64_t needed_bytes;/* bytes that must arrive; the rest may lie past the end of the file */
    uint8_t *dst;
} io_segment;

typedef enum { IO_DEMAND = 0, IO_SPECULATIVE = 1 } io_priority;

typedef struct io_job io_job;
typedef void (*io_job_done_fn)(void *ctx, io_job *job);

struct io_job {
    io_segment seg[IO_JOB_MAX_SEGMENTS];
    int n_segments;
    io_priority priority;
    io_job_done_fn done;
    void *done_ctx;
    /* results, valid in done() */
    int failed;
    ds4f_error err;
    uint64_t bytes_read;
    /* pool bookkeeping */
    int cursor_segment;
    uint64_t cursor_offset;
    int chunks_in_flight;
    int queued;
    io_job *prev, *next;
};

typedef struct io_pool_stats {
    uint64_t bytes_read;
    uint64_t chunks;
    uint64_t jobs_done, jobs_failed;
    uint64_t speculative_chunks;
    uint64_t promotions;   /* speculative jobs a demand caught up with */
} io_pool_stats;

typedef struct io_pool io_pool;

/* threads >= 1; chunk_bytes a multiple of IO_ALIGN; ops NULL: the system's. */
int io_pool_create(int threads, uint64_t chunk_bytes, const io_ops *ops, io_pool **out, ds4f_error *err);
/* Waits for every submitted job to finish, then stops the workers. */
void io_pool_destroy(io_pool *p);
/* The job must stay valid (and untouched) until its done() returned. */
void io_pool_submit(io_pool *p, io_job *job);
/* A demand now waits for this speculative job: the rest of its chunks issue at demand priority. */
void io_pool_promote(io_pool *p, io_job *job);
void io_pool_get_stats(io_pool *p, io_pool_stats *out);
int io_pool_threads(const io_pool *p);

#endif
