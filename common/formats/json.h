// json.h - what the file formats share on top of cJSON: checked building (out of memory aborts, as
// xmalloc does), numbers read strictly (an integer must be one), and floats written as the
// shortest decimal that reads back as the same float.
#ifndef MARLAAS_JSON_H
#define MARLAAS_JSON_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>

// x, or abort with a message when cJSON could not allocate it (x is NULL).
cJSON *json_need(cJSON *x);
// Appends a number to an array (aborts when out of memory).
void json_push_number(cJSON *arr, double v);
// The shortest decimal (6 to 9 significant digits) whose conversion to float gives x back: 1e-6f
// is written "1e-06", 0.1f "0.1", not the double expansion of the float.
double json_float_as_written(float x);
// A number that is an int exactly (no fraction, in range).
bool json_int(const cJSON *v, int *out);
// A number that is an unsigned integer exactly and below limit.
bool json_uint(const cJSON *v, double limit, uint64_t *out);

#endif
