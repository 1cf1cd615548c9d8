#include "stream/trace.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

int trace_create(stream_trace *t, const char *path, const trace_header *h, ds4f_error *err) {
    memset(t, 0, sizeof *t);
    t->file = fopen(path, "w");
    if (!t->file) return error_set(err, "%s: cannot create the trace: %s", path, strerror(errno));
    t->path = strdup(path);
    t->header = *h;
    fprintf(t->file, "# ds4f-trace 1 blocks=%d experts=%d k=%d hash_layers=%d main_blocks=%d expert_bytes=%" PRIu64 "\n",
            h->blocks, h->experts, h->k, h->hash_layers, h->main_blocks, h->expert_bytes);
    return 0;
}

void trace_record(stream_trace *t, uint64_t request, int64_t pos, int32_t token, int block, const int32_t *ids, int k) {
    if (!t->file) return;
    int rc = fprintf(t->file, "%" PRIu64 " %" PRId64 " %d %d", request, pos, token, block);
    for (int i = 0; i < k && rc >= 0; i++) rc = fprintf(t->file, " %d", ids[i]);
    if (rc >= 0) rc = fputc('\n', t->file);
    if (rc < 0) t->failed = 1;
}

int trace_close(stream_trace *t, ds4f_error *err) {
    int rc = 0;
    if (t->file) {
        if (fclose(t->file) != 0 || t->failed) rc = error_set(err, "%s: writing the trace failed", t->path);
    }
    free(t->path);
    memset(t, 0, sizeof *t);
    return rc;
}

static int header_field(const char *line, const char *key, long long *out) {
    const char *p = strstr(line, key);
    if (!p) return -1;
    char *end;
    *out = strtoll(p + strlen(key), &end, 10);
    return end == p + strlen(key) ? -1 : 0;
}

int trace_load(const char *path, trace_data *out, ds4f_error *err) {
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "r");
    if (!f) return error_set(err, "%s: cannot open: %s", path, strerror(errno));
    char line[4096];
    size_t line_no = 1, cap = 0;
    if (!fgets(line, sizeof line, f) || strncmp(line, "# ds4f-trace 1 ", 15) != 0) {
        fclose(f);
        return error_set(err, "%s: not a ds4f trace (no \"# ds4f-trace 1\" header line)", path);
    }
    long long v[6];
    const char *keys[6] = {"blocks=", "experts=", "k=", "hash_layers=", "main_blocks=", "expert_bytes="};
    for (int i = 0; i < 6; i++)
        if (header_field(line, keys[i], &v[i]) != 0 || v[i] < 0 || (i < 3 && v[i] < 1) || (i < 5 && v[i] > 1 << 20)) {
            fclose(f);
            return error_set(err, "%s: header lacks a valid %s", path, keys[i]);
        }
    out->header = (trace_header){(int)v[0], (int)v[1], (int)v[2], (int)v[3], (int)v[4], (uint64_t)v[5]};
    const int k = out->header.k;
    while (fgets(line, sizeof line, f)) {
        line_no++;
        if (line[0] == '#' || line[0] == '\n') continue;
        if (out->n_lines == cap) {
            cap = cap ? cap * 2 : 4096;
            trace_line *nl = realloc(out->lines, cap * sizeof *nl);
            int32_t *ne = realloc(out->experts, cap * (size_t)k * sizeof *ne);
            if (nl) out->lines = nl;
            if (ne) out->experts = ne;
            if (!nl || !ne) {
                fclose(f);
                trace_free(out);
                return error_set(err, "out of memory reading %s", path);
            }
        }
        trace_line *tl = &out->lines[out->n_lines];
        char *p = line, *end;
        long long fields[4];
        for (int i = 0; i < 4; i++) {
            fields[i] = strtoll(p, &end, 10);
            if (end == p) goto bad;
            p = end;
        }
        tl->request = (uint64_t)fields[0];
        tl->pos = fields[1];
        tl->token = (int32_t)fields[2];
        tl->block = (int32_t)fields[3];
        if (tl->block < 0 || tl->block >= out->header.blocks) goto bad;
        tl->first = (int32_t)(out->n_lines * (size_t)k);
        for (int i = 0; i < k; i++) {
            long e = strtol(p, &end, 10);
            if (end == p || e < 0 || e >= out->header.experts) goto bad;
            out->experts[tl->first + i] = (int32_t)e;
            p = end;
        }
        out->n_lines++;
        continue;
    bad:
        fclose(f);
        trace_free(out);
        return error_set(err, "%s:%zu: expected REQ POS TOKEN BLOCK and %d expert ids below the header's limits", path,
                         line_no, k);
    }
    fclose(f);
    return 0;
}

void trace_free(trace_data *t) {
    free(t->lines);
    free(t->experts);
    memset(t, 0, sizeof *t);
}
