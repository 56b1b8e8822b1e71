// strset.h - a set of strings with exact comparison (open addressing on a 64-bit FNV-1a hash,
// kept at most half full), for picking distinct items such as distinct prompts. The set keeps
// its own copies.
#ifndef MARLAAS_STRSET_H
#define MARLAAS_STRSET_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    char **slot;       // cap entries, NULL = free; owned copies
    uint64_t *hash;    // hash of each used slot
    size_t cap, n;
} strset_t;

// Adds s (NUL-terminated); returns 1 when it was new, 0 when the set already held it.
int strset_add(strset_t *set, const char *s);
void strset_free(strset_t *set);   // frees every copy; the set is empty and reusable

#endif
