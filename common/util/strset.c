// strset.c - see strset.h.
#include "common/util/strset.h"

#include <stdlib.h>
#include <string.h>

#include "common/util/util.h"

static uint64_t fnv1a(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ull;
    }
    return h;
}

static size_t find(const strset_t *set, const char *s, uint64_t h) {
    size_t i = (size_t)h & (set->cap - 1);
    while (set->slot[i] && (set->hash[i] != h || strcmp(set->slot[i], s) != 0)) i = (i + 1) & (set->cap - 1);
    return i;
}

int strset_add(strset_t *set, const char *s) {
    ASSERT(set != NULL && s != NULL);
    if (2 * (set->n + 1) > set->cap) {
        strset_t big = {.cap = set->cap ? 2 * set->cap : 64};
        big.slot = xcalloc(big.cap, sizeof *big.slot);
        big.hash = xcalloc(big.cap, sizeof *big.hash);
        for (size_t i = 0; i < set->cap; i++) {
            if (!set->slot[i]) continue;
            size_t j = find(&big, set->slot[i], set->hash[i]);
            big.slot[j] = set->slot[i];
            big.hash[j] = set->hash[i];
        }
        big.n = set->n;
        free(set->slot);
        free(set->hash);
        *set = big;
    }
    uint64_t h = fnv1a(s);
    size_t i = find(set, s, h);
    if (set->slot[i]) return 0;
    set->slot[i] = xstrdup(s);
    set->hash[i] = h;
    set->n++;
    return 1;
}

void strset_free(strset_t *set) {
    if (!set) return;
    for (size_t i = 0; i < set->cap; i++) free(set->slot[i]);
    free(set->slot);
    free(set->hash);
    *set = (strset_t){0};
}
