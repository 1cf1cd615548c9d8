#include "test_stream_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file_io.h"

int stream_test_tmpdir(char *out, size_t size) {
    const char *base = getenv("TMPDIR");
    snprintf(out, size, "%s/ds4f-stream-XXXXXX", base && *base ? base : "/tmp");
    return mkdtemp(out) ? 0 : -1;
}

void stream_test_rmdir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[1024];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    closedir(d);
    rmdir(dir);
}

int stream_test_pack(const char *model_dir, const char *out, ds4f_error *err) {
    checkpoint ck;
    if (checkpoint_open(&ck, model_dir, err) != 0) {
        checkpoint_close(&ck);
        return -1;
    }
    expert_pack_options po = {.show_progress = 0, .io_threads = 2, .direct_io = 1};
    expert_pack_result res;
    int rc = expert_pack_write(&ck, out, &po, &res, err);
    checkpoint_close(&ck);
    return rc;
}

int stream_test_direct_io_works(const char *dir) {
#ifdef O_DIRECT
    char path[1024];
    snprintf(path, sizeof path, "%s/direct-probe", dir);
    int fd = open(path, O_CREAT | O_RDWR | O_TRUNC, 0644);
    if (fd < 0) return 0;
    char block[4096] = {1};
    int ok = write(fd, block, sizeof block) == (ssize_t)sizeof block;
    close(fd);
    fd = ok ? open(path, O_RDONLY | O_DIRECT) : -1;
    void *buf = aligned_alloc(4096, 4096);
    ok = fd >= 0 && buf && pread(fd, buf, 4096, 0) == 4096;
    free(buf);
    if (fd >= 0) close(fd);
    unlink(path);
    return ok;
#else
    (void)dir;
    return 0;
#endif
}

int stream_test_load_weights(const char *dir, model_weights *w, ds4f_error *err) {
    model_load_options lo = {0};
    return model_weights_load(w, dir, &lo, err);
}

int stream_test_cache_from(model_weights *w, const char *packed_path, int direct, const expert_cache_options *co,
                           expert_source **out, ds4f_error *err) {
    expert_store st;
    expert_store_options so = {.direct_io = direct, .verify_checksums = 1};
    int rc = packed_path ? expert_store_open_packed(&st, packed_path, &w->ck, w->experts, &so, err)
                         : expert_store_open_shards(&st, &w->ck, w->experts, &so, err);
    if (rc != 0) return -1;
    return expert_cache_create(w, &st, co, out, err);
}

int stream_test_view_matches(const model_weights *w, int block, int expert, const expert_view *v) {
    const expert_extent *x = expert_extents(w, block, expert);
    const uint8_t *parts[EXPERT_PARTS] = {v->w1.packed, v->w1.scales, v->w3.packed, v->w3.scales, v->w2.packed, v->w2.scales};
    int ok = 1;
    for (int p = 0; p < EXPERT_PARTS && ok; p++) {
        uint8_t *buf = malloc(x[p].bytes);
        ds4f_error err;
        const st_file *f = &w->ck.shards[x[p].shard];
        ok = buf && file_pread_exact(f->fd, buf, x[p].bytes, x[p].offset, f->path, &err) == 0 &&
             memcmp(buf, parts[p], x[p].bytes) == 0;
        free(buf);
    }
    return ok;
}
