/* Helpers shared by the streaming tests (test_stream.c, test_stream_faults.c). */
#ifndef DS4F_TEST_STREAM_UTIL_H
#define DS4F_TEST_STREAM_UTIL_H

#include <stddef.h>

#include "model/expert_source.h"
#include "stream/expert_cache.h"

/* A fresh directory under $TMPDIR (or /tmp); removed with its files by stream_test_rmdir. */
int stream_test_tmpdir(char *out, size_t size);
void stream_test_rmdir(const char *dir);
int stream_test_pack(const char *model_dir, const char *out, ds4f_error *err);
/* Whether files in dir can be read with direct I/O. */
int stream_test_direct_io_works(const char *dir);
int stream_test_load_weights(const char *dir, model_weights *w, ds4f_error *err);
/* A streaming cache over w's shards (packed_path NULL) or a packed file. */
int stream_test_cache_from(model_weights *w, const char *packed_path, int direct, const expert_cache_options *co,
                           expert_source **out, ds4f_error *err);
static inline int stream_test_cache(model_weights *w, int unused, const expert_cache_options *co, expert_source **out,
                                    ds4f_error *err) {
    (void)unused;
    return stream_test_cache_from(w, NULL, 1, co, out, err);
}
/* Whether a view shows exactly the checkpoint's bytes of (block, expert). */
int stream_test_view_matches(const model_weights *w, int block, int expert, const expert_view *v);

#endif
