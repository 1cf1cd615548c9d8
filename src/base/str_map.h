/* String -> pointer hash map (open addressing). Keys are not copied: they must outlive the map.
 * Used for tensor-name lookup over the ~69k tensors of the real checkpoint. */
#ifndef DS4F_BASE_STR_MAP_H
#define DS4F_BASE_STR_MAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct str_map {
    const char **keys;
    void **values;
    size_t capacity; /* power of two */
    size_t count;
} str_map;

void str_map_init(str_map *m);
void str_map_free(str_map *m);
/* Returns 0 if inserted, 1 if the key already existed (value left unchanged), -1 on OOM. */
int str_map_put(str_map *m, const char *key, void *value);
void *str_map_get(const str_map *m, const char *key);
uint64_t str_hash(const char *s);

#endif
