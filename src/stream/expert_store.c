#include "stream/expert_store.h"
#include "base/file_io.h"
#include "base/progress.h"
#include "base/timer.h"
#include "model/expert_source.h"
#include "stream/checksum.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

/* Parts of one expert closer than this in the same file are read as one range: reading a small
 * gap costs less than another request. */
#define STORE_MERGE_GAP_BYTES (64u * 1024u)

static uint64_t align_down(uint64_t v) { return v & ~(uint64_t)(IO_ALIGN - 1); }
static uint64_t align_up(uint64_t v) { return (v + IO_ALIGN - 1) & ~(uint64_t)(IO_ALIGN - 1); }

static void put_le32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_le64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_le32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get_le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

int expert_extents_from_checkpoint(const checkpoint *ck, expert_extent **out, ds4f_error *err) {
    const model_config *c = &ck->config;
    const int n_blocks = config_total_blocks(c), E = c->n_routed_experts;
    const size_t n = (size_t)n_blocks * E * EXPERT_PARTS;
    expert_extent *x = calloc(n ? n : 1, sizeof *x);
    if (!x) return error_set(err, "out of memory");
    for (size_t i = 0; i < n; i++) x[i].shard = -1;
    for (size_t i = 0; i < ck->expected.count; i++) {
        const tensor_spec *s = &ck->expected.specs[i];
        if (s->expert < 0) continue;
        if (!ck->bound[i]) {
            free(x);
            return error_set(err, "%s: tensor '%s' is not bound", ck->dir, s->name);
        }
        expert_extent *e = &x[((size_t)s->block * E + (size_t)s->expert) * EXPERT_PARTS + s->part];
        e->shard = ck->bound_shard[i];
        e->offset = ck->bound[i]->offset;
        e->bytes = ck->bound[i]->bytes;
    }
    for (size_t i = 0; i < n; i++)
        if (x[i].shard < 0) {
            free(x);
            return error_set(err, "%s: block %zu expert %zu has no part %zu", ck->dir, i / EXPERT_PARTS / (size_t)E,
                             i / EXPERT_PARTS % (size_t)E, i % EXPERT_PARTS);
        }
    *out = x;
    return 0;
}

/* Opens for direct I/O when asked and the file system agrees (a probe read shows it: some file
 * systems accept O_DIRECT at open and refuse the reads), else buffered. */
static int store_file_open(store_file *f, const char *path, int want_direct, ds4f_error *err) {
    memset(f, 0, sizeof *f);
    f->fd = -1;
    f->path = strdup(path);
    if (!f->path) return error_set(err, "out of memory");
#ifdef O_DIRECT
    if (want_direct) {
        int fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
        if (fd >= 0) {
            void *probe = aligned_alloc(IO_ALIGN, IO_ALIGN);
            ssize_t n = probe ? pread(fd, probe, IO_ALIGN, 0) : -1;
            free(probe);
            if (n >= 0) {
                f->fd = fd;
                f->direct = 1;
            } else {
                close(fd);
            }
        }
    }
#endif
    if (f->fd < 0) {
        f->fd = open(path, O_RDONLY | O_CLOEXEC);
        if (f->fd < 0) return error_set(err, "%s: cannot open: %s", path, strerror(errno));
#ifdef F_NOCACHE
        if (want_direct && fcntl(f->fd, F_NOCACHE, 1) == 0) f->direct = 1;
#endif
    }
    return file_size(f->fd, &f->bytes, path, err);
}

static void store_file_close(store_file *f) {
    if (f->fd >= 0) close(f->fd);
    free(f->path);
    f->fd = -1;
    f->path = NULL;
}

/* Shards layout: groups the six parts by file and proximity; each group is one aligned range at
 * an aligned place in the slot. Returns the slot bytes used. slot/job may be NULL (measuring). */
static uint64_t plan_shards(const expert_store *st, int block, int expert, uint8_t *slot, io_job *job,
                            uint64_t part_offsets[EXPERT_PARTS]) {
    const expert_extent *x = &st->extents[((size_t)block * st->n_experts + (size_t)expert) * EXPERT_PARTS];
    int order[EXPERT_PARTS];
    for (int i = 0; i < EXPERT_PARTS; i++) order[i] = i;
    for (int i = 1; i < EXPERT_PARTS; i++)
        for (int j = i; j > 0; j--) {
            const expert_extent *a = &x[order[j - 1]], *b = &x[order[j]];
            if (a->shard < b->shard || (a->shard == b->shard && a->offset <= b->offset)) break;
            int t = order[j]; order[j] = order[j - 1]; order[j - 1] = t;
        }
    uint64_t slot_pos = 0;
    int n_groups = 0;
    int group_of[EXPERT_PARTS];
    uint64_t group_start[EXPERT_PARTS], group_end[EXPERT_PARTS], group_slot[EXPERT_PARTS];
    int32_t group_shard[EXPERT_PARTS];
    for (int i = 0; i < EXPERT_PARTS; i++) {
        const expert_extent *e = &x[order[i]];
        const int g = n_groups - 1;
        if (g >= 0 && group_shard[g] == e->shard && e->offset <= group_end[g] + STORE_MERGE_GAP_BYTES) {
            if (e->offset + e->bytes > group_end[g]) group_end[g] = e->offset + e->bytes;
        } else {
            group_shard[n_groups] = e->shard;
            group_start[n_groups] = e->offset;
            group_end[n_groups] = e->offset + e->bytes;
            n_groups++;
        }
        group_of[order[i]] = n_groups - 1;
    }
    for (int g = 0; g < n_groups; g++) {
        const uint64_t span_start = align_down(group_start[g]), span_end = align_up(group_end[g]);
        group_slot[g] = slot_pos;
        if (job) {
            const store_file *f = &st->files[group_shard[g]];
            job->seg[g] = (io_segment){.fd = f->fd, .path = f->path, .offset = span_start,
                                       .bytes = span_end - span_start, .needed_bytes = group_end[g] - span_start,
                                       .dst = slot + slot_pos};
        }
        slot_pos += span_end - span_start;
        group_start[g] = span_start;
    }
    if (job) job->n_segments = n_groups;
    if (part_offsets)
        for (int p = 0; p < EXPERT_PARTS; p++)
            part_offsets[p] = group_slot[group_of[p]] + (x[p].offset - group_start[group_of[p]]);
    return slot_pos;
}

static uint64_t record_offset(const expert_store *st, int block, int expert) {
    return st->header_bytes + ((uint64_t)block * st->n_experts + (uint64_t)expert) * st->record_stride;
}

void expert_store_plan_read(const expert_store *st, int block, int expert, uint8_t *slot, io_job *job,
                            uint64_t part_offsets[EXPERT_PARTS]) {
    if (!st->packed) {
        plan_shards(st, block, expert, slot, job, part_offsets);
        return;
    }
    const store_file *f = &st->files[0];
    job->seg[0] = (io_segment){.fd = f->fd, .path = f->path, .offset = record_offset(st, block, expert),
                               .bytes = st->record_stride, .needed_bytes = st->record_stride, .dst = slot};
    job->n_segments = 1;
    for (int p = 0; p < EXPERT_PARTS; p++) part_offsets[p] = st->record_offsets[p];
}

void expert_store_locate(const expert_store *st, int block, int expert, const char **path, uint64_t *offset) {
    if (st->packed) {
        *path = st->files[0].path;
        *offset = record_offset(st, block, expert);
        return;
    }
    const expert_extent *x = &st->extents[((size_t)block * st->n_experts + (size_t)expert) * EXPERT_PARTS];
    *path = st->files[x[0].shard].path;
    *offset = x[0].offset;
}

int expert_store_check(const expert_store *st, int block, int expert, const uint8_t *slot, ds4f_error *err) {
    if (!st->packed || !st->record_checksums) return 0;
    const uint64_t want = st->record_checksums[(size_t)block * st->n_experts + (size_t)expert];
    const uint64_t got = checksum64(slot, st->expert_bytes, 0);
    if (got != want)
        return error_set(err, "%s: record of block %d expert %d at offset %llu is damaged (checksum %016llx, header says %016llx); pack the experts again",
                         st->files[0].path, block, expert, (unsigned long long)record_offset(st, block, expert),
                         (unsigned long long)got, (unsigned long long)want);
    return 0;
}

uint64_t expert_pack_record_stride(const model_config *c) {
    uint64_t layout[EXPERT_PARTS + 1];
    expert_record_layout(c, layout);
    return align_up(layout[EXPERT_PARTS]);
}

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

int expert_checkpoint_fingerprint(const checkpoint *ck, const expert_extent *extents, uint64_t *out,
                                  ds4f_error *err) {
    char path[4096];
    path_join(path, sizeof path, ck->dir, "config.json");
    char *config_text;
    size_t config_len;
    if (file_read_all(path, &config_text, &config_len, err) != 0) return -1;
    checksum_state st;
    checksum_begin(&st, 0x6473346670616b31ull);
    checksum_update(&st, config_text, config_len);
    free(config_text);
    const model_config *c = &ck->config;
    const size_t n = (size_t)config_total_blocks(c) * c->n_routed_experts * EXPERT_PARTS;
    for (size_t i = 0; i < n; i++) {
        const char *name = base_name(ck->shards[extents[i].shard].path);
        uint8_t fields[16];
        put_le64(fields, extents[i].offset);
        put_le64(fields + 8, extents[i].bytes);
        checksum_update(&st, name, strlen(name) + 1);
        checksum_update(&st, fields, sizeof fields);
    }
    *out = checksum_end(&st);
    return 0;
}

static int store_common_init(expert_store *st, const checkpoint *ck, const expert_extent *extents, ds4f_error *err) {
    const model_config *c = &ck->config;
    memset(st, 0, sizeof *st);
    st->n_blocks = config_total_blocks(c);
    st->n_experts = c->n_routed_experts;
    expert_record_layout(c, st->record_offsets);
    st->expert_bytes = st->record_offsets[EXPERT_PARTS];
    for (int p = 0; p < EXPERT_PARTS; p++) st->part_bytes[p] = st->record_offsets[p + 1] - st->record_offsets[p];
    const size_t n = (size_t)st->n_blocks * st->n_experts * EXPERT_PARTS;
    st->extents = malloc((n ? n : 1) * sizeof *st->extents);
    if (!st->extents) return error_set(err, "out of memory");
    memcpy(st->extents, extents, n * sizeof *st->extents);
    for (size_t i = 0; i < n; i++)
        if (extents[i].bytes != st->part_bytes[i % EXPERT_PARTS])
            return error_set(err, "%s: block %zu expert %zu part %zu has %llu bytes, expected %llu", ck->dir,
                             i / EXPERT_PARTS / (size_t)st->n_experts, i / EXPERT_PARTS % (size_t)st->n_experts,
                             i % EXPERT_PARTS, (unsigned long long)extents[i].bytes,
                             (unsigned long long)st->part_bytes[i % EXPERT_PARTS]);
    return 0;
}

int expert_store_open_shards(expert_store *st, const checkpoint *ck, const expert_extent *extents,
                             const expert_store_options *opt, ds4f_error *err) {
    if (store_common_init(st, ck, extents, err) != 0) {
        expert_store_close(st);
        return -1;
    }
    st->files = calloc(ck->n_shards ? ck->n_shards : 1, sizeof *st->files);
    if (!st->files) {
        expert_store_close(st);
        return error_set(err, "out of memory");
    }
    st->direct_io = 1;
    for (size_t i = 0; i < ck->n_shards; i++) {
        if (store_file_open(&st->files[i], ck->shards[i].path, opt->direct_io, err) != 0) {
            expert_store_close(st);
            return -1;
        }
        st->n_files++;
        st->direct_io &= st->files[i].direct;
    }
    for (int b = 0; b < st->n_blocks; b++)
        for (int e = 0; e < st->n_experts; e++) {
            uint64_t need = plan_shards(st, b, e, NULL, NULL, NULL);
            if (need > st->slot_bytes) st->slot_bytes = need;
        }
    return 0;
}

/* Reads one expert from the checkpoint's shards (buffered) into record layout. */
static int read_expert_from_shards(const checkpoint *ck, const expert_store *st, int block, int expert,
                                   uint8_t *record, ds4f_error *err) {
    const expert_extent *x = &st->extents[((size_t)block * st->n_experts + (size_t)expert) * EXPERT_PARTS];
    for (int p = 0; p < EXPERT_PARTS; p++) {
        const st_file *f = &ck->shards[x[p].shard];
        if (file_pread_exact(f->fd, record + st->record_offsets[p], x[p].bytes, x[p].offset, f->path, err) != 0)
            return -1;
    }
    return 0;
}

int expert_store_open_packed(expert_store *st, const char *path, const checkpoint *ck, const expert_extent *extents,
                             const expert_store_options *opt, ds4f_error *err) {
    uint8_t *buf = NULL, *record = NULL;
    if (store_common_init(st, ck, extents, err) != 0) goto fail;
    st->packed = 1;
    st->files = calloc(1, sizeof *st->files);
    if (!st->files) {
        error_set(err, "out of memory");
        goto fail;
    }
    if (store_file_open(&st->files[0], path, opt->direct_io, err) != 0) goto fail;
    st->n_files = 1;
    st->direct_io = st->files[0].direct;
    const store_file *f = &st->files[0];
    const uint64_t n_records = (uint64_t)st->n_blocks * st->n_experts;
    st->record_stride = align_up(st->expert_bytes);
    st->header_bytes = align_up(PACK_FIXED_HEADER_BYTES + 8 * n_records);
    st->slot_bytes = st->record_stride;

    buf = aligned_alloc(IO_ALIGN, st->header_bytes);
    if (!buf) {
        error_set(err, "out of memory");
        goto fail;
    }
    if (f->bytes < st->header_bytes) {
        error_set(err, "%s: %llu bytes is too short for a packed expert file of this model (header alone: %llu)", path,
                  (unsigned long long)f->bytes, (unsigned long long)st->header_bytes);
        goto fail;
    }
    if (file_pread_exact(f->fd, buf, st->header_bytes, 0, path, err) != 0) goto fail;
    if (memcmp(buf, PACK_MAGIC, 8) != 0) {
        error_set(err, "%s: not a packed expert file (no %s magic at offset 0)", path, PACK_MAGIC);
        goto fail;
    }
    if (get_le32(buf + 8) != PACK_VERSION) {
        error_set(err, "%s: packed file version %u, this build reads version %d", path, get_le32(buf + 8), PACK_VERSION);
        goto fail;
    }
    const uint64_t stored_header_checksum = get_le64(buf + 48);
    put_le64(buf + 48, 0);
    if (checksum64(buf, st->header_bytes, 0) != stored_header_checksum) {
        error_set(err, "%s: header (bytes 0..%llu) is damaged: its checksum does not match; pack the experts again", path,
                  (unsigned long long)st->header_bytes);
        goto fail;
    }
    if (get_le32(buf + 12) != st->header_bytes || get_le64(buf + 16) != st->record_stride ||
        get_le64(buf + 24) != st->expert_bytes || get_le32(buf + 32) != (uint32_t)st->n_blocks ||
        get_le32(buf + 36) != (uint32_t)st->n_experts) {
        error_set(err, "%s: packed for another model shape (%u blocks x %u experts of %llu bytes, stride %llu; this "
                  "checkpoint: %d x %d of %llu, stride %llu)", path, get_le32(buf + 32), get_le32(buf + 36),
                  (unsigned long long)get_le64(buf + 24), (unsigned long long)get_le64(buf + 16), st->n_blocks,
                  st->n_experts, (unsigned long long)st->expert_bytes, (unsigned long long)st->record_stride);
        goto fail;
    }
    for (int p = 0; p <= EXPERT_PARTS; p++)
        if (get_le64(buf + 56 + 8 * p) != st->record_offsets[p]) {
            error_set(err, "%s: record layout differs from this build's (part %d at %llu, expected %llu)", path, p,
                      (unsigned long long)get_le64(buf + 56 + 8 * p), (unsigned long long)st->record_offsets[p]);
            goto fail;
        }
    if (expert_checkpoint_fingerprint(ck, extents, &st->fingerprint, err) != 0) goto fail;
    if (get_le64(buf + 40) != st->fingerprint) {
        error_set(err, "%s: packed from another checkpoint (fingerprint %016llx, %s has %016llx)", path,
                  (unsigned long long)get_le64(buf + 40), ck->dir, (unsigned long long)st->fingerprint);
        goto fail;
    }
    const uint64_t need_bytes = st->header_bytes + n_records * st->record_stride;
    if (f->bytes < need_bytes) {
        error_set(err, "%s: truncated: %llu bytes, the header promises %llu", path, (unsigned long long)f->bytes,
                  (unsigned long long)need_bytes);
        goto fail;
    }
    st->record_checksums = malloc(n_records * sizeof(uint64_t));
    if (!st->record_checksums) {
        error_set(err, "out of memory");
        goto fail;
    }
    for (uint64_t i = 0; i < n_records; i++) st->record_checksums[i] = get_le64(buf + PACK_FIXED_HEADER_BYTES + 8 * i);

    /* Same places need not mean same bytes (another seed of a synthetic model, a re-export):
     * the first and last records must equal the checkpoint's own bytes. */
    record = aligned_alloc(IO_ALIGN, st->record_stride);
    if (!record) {
        error_set(err, "out of memory");
        goto fail;
    }
    const int samples[2][2] = {{0, 0}, {st->n_blocks - 1, st->n_experts - 1}};
    for (int i = 0; i < 2; i++) {
        const int b = samples[i][0], e = samples[i][1];
        if (read_expert_from_shards(ck, st, b, e, record, err) != 0) goto fail;
        if (checksum64(record, st->expert_bytes, 0) != st->record_checksums[(size_t)b * st->n_experts + (size_t)e]) {
            error_set(err, "%s: record of block %d expert %d (offset %llu) does not hold the bytes of %s; it was packed "
                      "from another checkpoint", path, b, e, (unsigned long long)record_offset(st, b, e), ck->dir);
            goto fail;
        }
    }
    if (!opt->verify_checksums) {
        free(st->record_checksums);
        st->record_checksums = NULL;
    }
    free(buf);
    free(record);
    return 0;
fail:
    free(buf);
    free(record);
    expert_store_close(st);
    return -1;
}

void expert_store_close(expert_store *st) {
    for (int i = 0; i < st->n_files; i++) store_file_close(&st->files[i]);
    free(st->files);
    free(st->extents);
    free(st->record_checksums);
    memset(st, 0, sizeof *st);
}

/* ---- pack ---- */

typedef struct pack_ring_entry {
    io_job job;
    uint8_t *slot;
    uint64_t part_offsets[EXPERT_PARTS];
    int done;
} pack_ring_entry;

typedef struct pack_ring {
    pthread_mutex_t lock;
    pthread_cond_t arrived;
} pack_ring;

static void pack_job_done(void *ctx, io_job *job) {
    pack_ring *ring = ctx;
    pack_ring_entry *entry = (pack_ring_entry *)job; /* job is the first member */
    pthread_mutex_lock(&ring->lock);
    entry->done = 1;
    pthread_cond_broadcast(&ring->arrived);
    pthread_mutex_unlock(&ring->lock);
}

static int pwrite_exact(int fd, const void *src, uint64_t bytes, uint64_t offset, const char *path, ds4f_error *err) {
    const uint8_t *p = src;
    uint64_t done = 0;
    while (done < bytes) {
        ssize_t n = pwrite(fd, p + done, (size_t)(bytes - done), (off_t)(offset + done));
        if (n < 0) {
            if (errno == EINTR) continue;
            return error_set(err, "%s: write of %llu bytes at offset %llu failed: %s", path,
                             (unsigned long long)(bytes - done), (unsigned long long)(offset + done), strerror(errno));
        }
        done += (uint64_t)n;
    }
    return 0;
}

#define PACK_RING 8

int expert_pack_write(const checkpoint *ck, const char *out_path, const expert_pack_options *opt,
                      expert_pack_result *result, ds4f_error *err) {
    const double start = time_now_seconds();
    memset(result, 0, sizeof *result);
    expert_extent *extents = NULL;
    expert_store st = {0};
    io_pool *pool = NULL;
    pack_ring ring;
    pack_ring_entry entries[PACK_RING];
    memset(entries, 0, sizeof entries);
    uint8_t *record = NULL, *header = NULL;
    uint64_t *checksums = NULL;
    char tmp_path[4096];
    snprintf(tmp_path, sizeof tmp_path, "%s.partial", out_path);
    int out_fd = -1, rc = -1, submitted = 0, completed = 0;
    pthread_mutex_init(&ring.lock, NULL);
    pthread_cond_init(&ring.arrived, NULL);

    if (expert_extents_from_checkpoint(ck, &extents, err) != 0) goto done;
    expert_store_options so = {.direct_io = opt->direct_io, .verify_checksums = 0};
    if (expert_store_open_shards(&st, ck, extents, &so, err) != 0) goto done;
    const uint64_t n_records = (uint64_t)st.n_blocks * st.n_experts;
    const uint64_t stride = align_up(st.expert_bytes);
    const uint64_t header_bytes = align_up(PACK_FIXED_HEADER_BYTES + 8 * n_records);
    const uint64_t file_bytes = header_bytes + n_records * stride;

    char dir[4096];
    snprintf(dir, sizeof dir, "%s", out_path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    else snprintf(dir, sizeof dir, ".");
    struct statvfs vfs;
    if (statvfs(dir, &vfs) == 0 && (uint64_t)vfs.f_bavail * vfs.f_frsize < file_bytes) {
        error_set(err, "%s: the packed file needs %.2f GB, the file system has %.2f GB free", out_path,
                  (double)file_bytes / 1e9, (double)vfs.f_bavail * vfs.f_frsize / 1e9);
        goto done;
    }
    int direct_out = 0;
#ifdef O_DIRECT
    if (opt->direct_io) {
        out_fd = open(tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0644);
        direct_out = out_fd >= 0;
    }
#endif
    if (out_fd < 0) out_fd = open(tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out_fd < 0) {
        error_set(err, "%s: cannot create: %s", tmp_path, strerror(errno));
        goto done;
    }
    (void)direct_out;
    record = aligned_alloc(IO_ALIGN, stride);
    header = aligned_alloc(IO_ALIGN, header_bytes);
    checksums = calloc(n_records ? n_records : 1, sizeof *checksums);
    if (!record || !header || !checksums) {
        error_set(err, "out of memory");
        goto done;
    }
    memset(record, 0, stride);
    for (int i = 0; i < PACK_RING; i++) {
        entries[i].slot = aligned_alloc(IO_ALIGN, st.slot_bytes);
        if (!entries[i].slot) {
            error_set(err, "out of memory");
            goto done;
        }
    }
    if (io_pool_create(opt->io_threads > 0 ? opt->io_threads : 4, 1u << 20, NULL, &pool, err) != 0) goto done;

    progress bar;
    progress_begin(&bar, "pack", n_records * st.expert_bytes, "B");
    if (!opt->show_progress) bar.enabled = 0;
    /* Reads run PACK_RING experts ahead of the writer; records are written in order. */
    for (uint64_t i = 0; i < n_records; i++) {
        while (submitted < (int64_t)n_records && (uint64_t)submitted < i + PACK_RING) {
            pack_ring_entry *e = &entries[submitted % PACK_RING];
            const int b = (int)(submitted / st.n_experts), x = (int)(submitted % st.n_experts);
            expert_store_plan_read(&st, b, x, e->slot, &e->job, e->part_offsets);
            e->job.priority = IO_DEMAND;
            e->job.done = pack_job_done;
            e->job.done_ctx = &ring;
            e->done = 0;
            io_pool_submit(pool, &e->job);
            submitted++;
        }
        pack_ring_entry *e = &entries[i % PACK_RING];
        pthread_mutex_lock(&ring.lock);
        while (!e->done) pthread_cond_wait(&ring.arrived, &ring.lock);
        pthread_mutex_unlock(&ring.lock);
        completed++;
        if (e->job.failed) {
            *err = e->job.err;
            goto done;
        }
        result->bytes_read += e->job.bytes_read;
        for (int p = 0; p < EXPERT_PARTS; p++)
            memcpy(record + st.record_offsets[p], e->slot + e->part_offsets[p], st.part_bytes[p]);
        checksums[i] = checksum64(record, st.expert_bytes, 0);
        if (pwrite_exact(out_fd, record, stride, header_bytes + i * stride, tmp_path, err) != 0) goto done;
        progress_update(&bar, (i + 1) * st.expert_bytes);
    }
    progress_end(&bar);

    memset(header, 0, header_bytes);
    memcpy(header, PACK_MAGIC, 8);
    put_le32(header + 8, PACK_VERSION);
    put_le32(header + 12, (uint32_t)header_bytes);
    put_le64(header + 16, stride);
    put_le64(header + 24, st.expert_bytes);
    put_le32(header + 32, (uint32_t)st.n_blocks);
    put_le32(header + 36, (uint32_t)st.n_experts);
    uint64_t fingerprint;
    if (expert_checkpoint_fingerprint(ck, extents, &fingerprint, err) != 0) goto done;
    put_le64(header + 40, fingerprint);
    for (int p = 0; p <= EXPERT_PARTS; p++) put_le64(header + 56 + 8 * p, st.record_offsets[p]);
    for (uint64_t i = 0; i < n_records; i++) put_le64(header + PACK_FIXED_HEADER_BYTES + 8 * i, checksums[i]);
    put_le64(header + 48, checksum64(header, header_bytes, 0));
    if (pwrite_exact(out_fd, header, header_bytes, 0, tmp_path, err) != 0) goto done;
    if (fsync(out_fd) != 0) {
        error_set(err, "%s: fsync failed: %s", tmp_path, strerror(errno));
        goto done;
    }
    if (close(out_fd) != 0) {
        out_fd = -1;
        error_set(err, "%s: close failed: %s", tmp_path, strerror(errno));
        goto done;
    }
    out_fd = -1;
    if (rename(tmp_path, out_path) != 0) {
        error_set(err, "%s: rename to %s failed: %s", tmp_path, out_path, strerror(errno));
        goto done;
    }
    result->records = n_records;
    result->file_bytes = file_bytes;
    rc = 0;
done:
    /* Let every submitted read land before its buffer goes. */
    if (pool) {
        pthread_mutex_lock(&ring.lock);
        for (int i = completed; i < submitted; i++)
            while (!entries[i % PACK_RING].done) pthread_cond_wait(&ring.arrived, &ring.lock);
        pthread_mutex_unlock(&ring.lock);
        io_pool_destroy(pool);
    }
    if (out_fd >= 0) close(out_fd);
    if (rc != 0) unlink(tmp_path);
    for (int i = 0; i < PACK_RING; i++) free(entries[i].slot);
    free(record);
    free(header);
    free(checksums);
    free(extents);
    expert_store_close(&st);
    pthread_mutex_destroy(&ring.lock);
    pthread_cond_destroy(&ring.arrived);
    result->seconds = time_now_seconds() - start;
    return rc;
}
