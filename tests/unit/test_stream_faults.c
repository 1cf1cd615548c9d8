/* Invariant 3 (no partial data): an I/O error, a short read and a damaged packed file each stop
 * the run with a message naming the file and offset, and the expert is never published half
 * read. Faults are injected through the I/O layer (io_ops), in a chunk after the first, so that
 * part of the expert did arrive. */
#include "test.h"
#include "test_stream_util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file_io.h"
#include "nn/session.h"
#include "stream/expert_store.h"

#define SMALL "tests/data/golden/small"
#define T_TOKENS 12

typedef enum { FAULT_NONE, FAULT_EIO, FAULT_SHORT } fault_mode;

typedef struct fault_io {
    fault_mode mode;
    dev_t dev;           /* the shard's file (whichever descriptor reads it)... */
    ino_t ino;
    uint64_t at;         /* ...and the byte whose read fails */
    int hits;
} fault_io;

static ssize_t fault_pread(void *ctx, int fd, void *dst, size_t bytes, uint64_t offset) {
    fault_io *f = ctx;
    struct stat st;
    if (f->mode != FAULT_NONE && offset <= f->at && f->at < offset + bytes && fstat(fd, &st) == 0 &&
        st.st_dev == f->dev && st.st_ino == f->ino) {
        __atomic_add_fetch(&f->hits, 1, __ATOMIC_SEQ_CST);
        if (f->mode == FAULT_EIO) {
            errno = EIO;
            return -1;
        }
        /* The file seems to end at `at`: the bytes before it arrive, then nothing. (The real read
         * is done in full: direct I/O refuses unaligned lengths.) */
        const size_t n = (size_t)(f->at - offset);
        if (n == 0) return 0;
        ssize_t got = pread(fd, dst, bytes, (off_t)offset);
        return got < 0 ? got : (ssize_t)n;
    }
    return pread(fd, dst, bytes, (off_t)offset);
}

static void test_tokens(const model_weights *w, int32_t *tokens) {
    for (int i = 0; i < T_TOKENS; i++) tokens[i] = (int32_t)((i * 131 + 17) % w->config.vocab_size);
}

/* Runs the tokens through a fresh session over src: 0 or -1 with err. */
static int run_tokens(model_weights *w, expert_source *src, float *logits, ds4f_error *err) {
    int32_t tokens[T_TOKENS];
    test_tokens(w, tokens);
    nn_session *s = NULL;
    if (nn_session_create(w, src, T_TOKENS, 4, &s, err) != 0) return -1;
    int rc = nn_forward(s, tokens, T_TOKENS, logits, 1, err);
    nn_session_free(s);
    return rc;
}

/* Descriptors open now (a leak check). */
static int open_fds(void) {
    int n = 0;
    for (int fd = 0; fd < 4096; fd++) n += fcntl(fd, F_GETFD) != -1;
    return n;
}

static void check_fault(fault_mode mode, int block, int prefetch) {
    model_weights w;
    ds4f_error err = {{0}};
    if (stream_test_load_weights(SMALL, &w, &err) != 0) {
        CHECK(0, "%s", err.msg);
        return;
    }
    const int K = w.config.num_experts_per_tok, E = w.config.n_routed_experts;
    int32_t tokens[T_TOKENS];
    test_tokens(&w, tokens);
    const int expert = (int)w.blocks[block].tid2eid[(size_t)tokens[0] * K]; /* hash-routed: known in advance */
    const expert_extent *x = expert_extents(&w, block, expert);
    struct stat shard;
    fstat(w.ck.shards[x[EXPERT_W2_WEIGHT].shard].fd, &shard);
    fault_io f = {FAULT_NONE, shard.st_dev, shard.st_ino, x[EXPERT_W2_WEIGHT].offset + 1000, 0};
    const int fds_before = open_fds();
    const io_ops ops = {&f, fault_pread};
    expert_cache_options co;
    expert_cache_options_init(&co);
    co.slots = 8;
    co.io_chunk_bytes = 4096; /* the expert arrives in many chunks: the earlier ones succeed */
    co.io = &ops;
    co.prefetch = prefetch;
    expert_source *src = NULL;
    float *logits = malloc((size_t)T_TOKENS * w.config.vocab_size * sizeof(float));
    if (!logits || stream_test_cache(&w, 0, &co, &src, &err) != 0) {
        CHECK(0, "%s", err.msg);
        free(logits);
        model_weights_free(&w);
        return;
    }
    f.mode = mode;
    const int rc = run_tokens(&w, src, logits, &err);
    const char *path = w.ck.shards[x[EXPERT_W2_WEIGHT].shard].path;
    char offset[64];
    snprintf(offset, sizeof offset, "offset %llu", (unsigned long long)(f.at & ~(uint64_t)4095));
    CHECK(rc == -1, "mode %d block %d: the run must stop", mode, block);
    CHECK(strstr(err.msg, path) && strstr(err.msg, offset), "the message names %s and %s: %s", path, offset, err.msg);
    CHECK(mode != FAULT_SHORT || strstr(err.msg, "short read"), "says short read: %s", err.msg);
    CHECK(mode != FAULT_EIO || strstr(err.msg, "failed"), "says the read failed: %s", err.msg);
    CHECK(f.hits >= 1, "the fault was hit");
    CHECK(expert_cache_key_state(src, block * E + expert) != 2, "the half-read expert was never published READY");
    stream_stats st;
    expert_cache_get_stats(src, &st);
    CHECK(st.read_failures >= 1, "read failures counted");
    /* Without the fault the same cache recovers and computes what the resident source does. */
    f.mode = FAULT_NONE;
    CHECK(run_tokens(&w, src, logits, &err) == 0, "after the fault: %s", err.msg);
    expert_source *resident = NULL;
    float *ref = malloc((size_t)T_TOKENS * w.config.vocab_size * sizeof(float));
    CHECK(ref && expert_source_resident_create(&w, 0, &resident, &err) == 0 && run_tokens(&w, resident, ref, &err) == 0,
          "reference: %s", err.msg);
    CHECK(ref && !memcmp(ref, logits, (size_t)T_TOKENS * w.config.vocab_size * sizeof(float)),
          "logits after recovery equal the resident run");
    if (resident) resident->destroy(resident);
    free(ref);
    src->destroy(src);
    CHECK(open_fds() == fds_before, "the cache closed its files (%d descriptors open, %d before)", open_fds(), fds_before);
    free(logits);
    model_weights_free(&w);
}

TEST(stream_fault_io_error_stops_the_run) {
    check_fault(FAULT_EIO, 0, 0);
    check_fault(FAULT_EIO, 1, 1); /* block 1 is read first by a prefetch hint, then by demand */
}

TEST(stream_fault_short_read_stops_the_run) {
    check_fault(FAULT_SHORT, 0, 1);
    check_fault(FAULT_SHORT, 2, 0);
}

static int flip_byte(const char *path, uint64_t offset) {
    int fd = open(path, O_RDWR);
    if (fd < 0) return -1;
    uint8_t b;
    int ok = pread(fd, &b, 1, (off_t)offset) == 1;
    b ^= 0x5a;
    ok = ok && pwrite(fd, &b, 1, (off_t)offset) == 1;
    close(fd);
    return ok ? 0 : -1;
}

static int copy_file(const char *from, const char *to, uint64_t max_bytes) {
    char *data;
    size_t len;
    ds4f_error err;
    if (file_read_all(from, &data, &len, &err) != 0) return -1;
    int rc = file_write_all(to, data, len < max_bytes ? len : (size_t)max_bytes, &err);
    free(data);
    return rc;
}

TEST(stream_fault_damaged_packed_record_stops_the_run) {
    char dir[256], packed[300];
    ds4f_error err = {{0}};
    REQUIRE(stream_test_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    snprintf(packed, sizeof packed, "%s/small.experts", dir);
    REQUIRE(stream_test_pack(SMALL, packed, &err) == 0, "pack: %s", err.msg);
    model_weights w;
    REQUIRE(stream_test_load_weights(SMALL, &w, &err) == 0, "%s", err.msg);
    const int K = w.config.num_experts_per_tok, E = w.config.n_routed_experts;
    int32_t tokens[T_TOKENS];
    test_tokens(&w, tokens);
    const int block = 2, expert = (int)w.blocks[block].tid2eid[(size_t)tokens[0] * K];
    expert_store st;
    expert_store_options so = {.direct_io = 1, .verify_checksums = 1};
    REQUIRE(expert_store_open_packed(&st, packed, &w.ck, w.experts, &so, &err) == 0, "%s", err.msg);
    const uint64_t record = st.header_bytes + ((uint64_t)block * E + (uint64_t)expert) * st.record_stride;
    expert_store_close(&st);
    REQUIRE(flip_byte(packed, record + st.record_offsets[EXPERT_W3_WEIGHT] + 77) == 0, "damage the record");

    expert_cache_options co;
    expert_cache_options_init(&co);
    co.slots = 10;
    expert_source *src = NULL;
    float *logits = malloc((size_t)T_TOKENS * w.config.vocab_size * sizeof(float));
    REQUIRE(logits && stream_test_cache_from(&w, packed, 1, &co, &src, &err) == 0, "%s", err.msg);
    char offset[64];
    snprintf(offset, sizeof offset, "offset %llu", (unsigned long long)record);
    CHECK(run_tokens(&w, src, logits, &err) == -1, "the run must stop");
    CHECK(strstr(err.msg, packed) && strstr(err.msg, offset) && strstr(err.msg, "damaged"),
          "the message names %s and %s: %s", packed, offset, err.msg);
    CHECK(expert_cache_key_state(src, block * E + expert) != 2, "the damaged record was never published READY");
    src->destroy(src);
    free(logits);

    /* Refused at open: a damaged header, a truncated file, another model, another checkpoint. */
    char other[300], copy_dir[300], path[400];
    snprintf(other, sizeof other, "%s/damaged-header.experts", dir);
    REQUIRE(copy_file(packed, other, UINT64_MAX) == 0 && flip_byte(other, 600) == 0, "copy");
    CHECK(expert_store_open_packed(&st, other, &w.ck, w.experts, &so, &err) != 0 && strstr(err.msg, "header") &&
              strstr(err.msg, other),
          "damaged header: %s", err.msg);
    snprintf(other, sizeof other, "%s/truncated.experts", dir);
    REQUIRE(copy_file(packed, other, record) == 0, "copy");
    CHECK(expert_store_open_packed(&st, other, &w.ck, w.experts, &so, &err) != 0 && strstr(err.msg, "truncated"),
          "truncated: %s", err.msg);
    snprintf(other, sizeof other, "%s/wide.experts", dir);
    REQUIRE(stream_test_pack("tests/data/golden/wide", other, &err) == 0, "pack wide: %s", err.msg);
    CHECK(expert_store_open_packed(&st, other, &w.ck, w.experts, &so, &err) != 0 && strstr(err.msg, "another model"),
          "packed from another model: %s", err.msg);
    /* The same tensors with a config.json that differs by one newline: another checkpoint. */
    snprintf(copy_dir, sizeof copy_dir, "%s/small-copy", dir);
    REQUIRE(mkdir(copy_dir, 0755) == 0, "mkdir");
    const char *files[] = {"model.safetensors", "model.safetensors.index.json", "config.json"};
    for (int i = 0; i < 3; i++) {
        char from[400];
        snprintf(from, sizeof from, SMALL "/%s", files[i]);
        snprintf(path, sizeof path, "%s/%s", copy_dir, files[i]);
        REQUIRE(copy_file(from, path, UINT64_MAX) == 0, "copy %s", files[i]);
    }
    FILE *cfg = fopen(path, "a");
    REQUIRE(cfg && fputc('\n', cfg) != EOF && fclose(cfg) == 0, "edit config");
    model_weights w2;
    REQUIRE(stream_test_load_weights(copy_dir, &w2, &err) == 0, "%s", err.msg);
    CHECK(expert_store_open_packed(&st, packed, &w2.ck, w2.experts, &so, &err) != 0 &&
              strstr(err.msg, "another checkpoint"),
          "packed from another checkpoint: %s", err.msg);
    model_weights_free(&w2);
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", copy_dir, files[i]);
        unlink(path);
    }
    rmdir(copy_dir);
    model_weights_free(&w);
    stream_test_rmdir(dir);
}
