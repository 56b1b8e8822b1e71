// jobdata.c - reading a job's uploaded dataset back from Redis.
#include "common/rl/jobdata.h"
#include "common/rl/keys.h"

#include <stdlib.h>
#include <string.h>

dataset_t *jobdata_dataset(store_t *st, const char *job, const jobspec_t *spec, char *err) {
    char key[256];
    store_buf_t *lines = NULL;
    int n = 0;
    verify_spec_t vs;
    if (verify_spec_parse(&vs, spec->verifier, err)) return NULL;
    if (!key_job_data(st, key, sizeof key, job)) {
        err_set(err, "job id too long");
        return NULL;
    }
    if (store_lrange(st, key, 0, -1, &lines, &n, err)) return NULL;
    size_t total = 0;
    for (int i = 0; i < n; i++) total += lines[i].len + 1;
    char *buf = xmalloc(total + 1), *p = buf;
    for (int i = 0; i < n; i++) {
        memcpy(p, lines[i].data, lines[i].len);
        p += lines[i].len;
        *p++ = '\n';
    }
    store_bufv_free(&lines, n);
    dataset_t *ds = dataset_parse(spec->task, buf, (size_t)(p - buf), &vs, err);
    free(buf);
    return ds;
}
