#include "base/str_map.h"

#include <stdlib.h>
#include <string.h>

uint64_t str_hash(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

void str_map_init(str_map *m) { memset(m, 0, sizeof *m); }

void str_map_free(str_map *m) {
    free(m->keys);
    free(m->values);
    memset(m, 0, sizeof *m);
}

static int grow(str_map *m) {
    size_t cap = m->capacity ? m->capacity * 2 : 64;
    const char **keys = calloc(cap, sizeof *keys);
    void **values = calloc(cap, sizeof *values);
    if (!keys || !values) { free(keys); free(values); return -1; }
    for (size_t i = 0; i < m->capacity; i++) {
        if (!m->keys[i]) continue;
        size_t j = str_hash(m->keys[i]) & (cap - 1);
        while (keys[j]) j = (j + 1) & (cap - 1);
        keys[j] = m->keys[i];
        values[j] = m->values[i];
    }
    free(m->keys);
    free(m->values);
    m->keys = keys;
    m->values = values;
    m->capacity = cap;
    return 0;
}

int str_map_put(str_map *m, const char *key, void *value) {
    if ((m->count + 1) * 2 > m->capacity && grow(m) != 0) return -1;
    size_t j = str_hash(key) & (m->capacity - 1);
    while (m->keys[j]) {
        if (!strcmp(m->keys[j], key)) return 1;
        j = (j + 1) & (m->capacity - 1);
    }
    m->keys[j] = key;
    m->values[j] = value;
    m->count++;
    return 0;
}

void *str_map_get(const str_map *m, const char *key) {
    if (!m->capacity) return NULL;
    size_t j = str_hash(key) & (m->capacity - 1);
    while (m->keys[j]) {
        if (!strcmp(m->keys[j], key)) return m->values[j];
        j = (j + 1) & (m->capacity - 1);
    }
    return NULL;
}
