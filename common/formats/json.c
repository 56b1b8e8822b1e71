// json.c - shared cJSON helpers of the file formats (json.h).
#include "common/formats/json.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/util/log.h"

cJSON *json_need(cJSON *x) {
    if (!x) {
        log_fatal("out of memory building JSON");
        abort();
    }
    return x;
}

void json_push_number(cJSON *arr, double v) {
    if (!cJSON_AddItemToArray(arr, json_need(cJSON_CreateNumber(v)))) json_need(NULL);
}

double json_float_as_written(float x) {
    char buf[32];
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, (double)x);
        // readers convert the parsed double to float: check exactly that path
        if ((float)strtod(buf, NULL) == x) return strtod(buf, NULL);
    }
    return (double)x;
}

bool json_int(const cJSON *v, int *out) {
    if (!cJSON_IsNumber(v)) return false;
    double d = v->valuedouble;
    if (!(d >= INT_MIN && d <= INT_MAX) || (double)(int)d != d) return false;
    *out = (int)d;
    return true;
}

bool json_uint(const cJSON *v, double limit, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return false;
    double d = v->valuedouble;
    if (!(d >= 0 && d < limit)) return false;   // also rejects NaN
    uint64_t u = (uint64_t)d;
    if ((double)u != d) return false;
    *out = u;
    return true;
}
