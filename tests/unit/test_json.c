// test_json.c - the file formats' shared cJSON helpers: floats written as read, strict integers.
#include <criterion/criterion.h>
#include <math.h>

#include "common/formats/json.h"

Test(json, floats_written_as_the_shortest_decimal_that_reads_back) {
    cr_assert_eq(json_float_as_written(0.1f), 0.1);
    cr_assert_eq(json_float_as_written(1e-6f), 1e-6);
    cr_assert_eq(json_float_as_written(16.0f), 16.0);
    cr_assert_eq(json_float_as_written(0.6f), 0.6);
    // every float comes back through the double it is written as
    float xs[] = {3.14159265f, 1.17549435e-38f, 3.4028235e38f, 1e-45f, 1234567.8f, -2.5e-7f};
    for (size_t i = 0; i < sizeof xs / sizeof *xs; i++)
        cr_assert_eq((float)json_float_as_written(xs[i]), xs[i], "%.9g", (double)xs[i]);
}

Test(json, integers_are_read_strictly) {
    int i;
    uint64_t u;
    cJSON *n = cJSON_CreateNumber(42);
    cr_assert(json_int(n, &i) && i == 42);
    cJSON_SetNumberValue(n, 1.5);
    cr_assert(!json_int(n, &i), "a fraction is not an int");
    cJSON_SetNumberValue(n, 2147483648.0);
    cr_assert(!json_int(n, &i), "out of int range");
    cJSON_SetNumberValue(n, NAN);
    cr_assert(!json_int(n, &i) && !json_uint(n, 1e9, &u), "NaN");
    cJSON_SetNumberValue(n, 7);
    cr_assert(json_uint(n, 8, &u) && u == 7);
    cr_assert(!json_uint(n, 7, &u), "at the limit");
    cJSON_SetNumberValue(n, -1);
    cr_assert(!json_uint(n, 8, &u), "negative");
    cJSON *s = cJSON_CreateString("7");
    cr_assert(!json_int(s, &i) && !json_uint(s, 8, &u), "a string is not a number");
    cJSON_Delete(s);
    cJSON_Delete(n);
}

Test(json, numbers_pushed_in_order) {
    cJSON *a = json_need(cJSON_CreateArray());
    json_push_number(a, 1);
    json_push_number(a, 2.5);
    char *t = cJSON_PrintUnformatted(a);
    cr_assert_str_eq(t, "[1,2.5]");
    free(t);
    cJSON_Delete(a);
}
