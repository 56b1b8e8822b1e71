// math_answer.h - the final numeric answer of a worked solution, as math benchmarks grade it
// (GSM8K's "#### 72", MATH's "\boxed{72}", or the last number written).
//
// Where the answer is, in this order:
//   1. the content of the last \boxed{...} (or \fbox{...}), braces balanced;
//   2. else the text after the last "####";
//   3. else the whole text.
// What the answer is, in the chosen text: after dropping spaces, `$`, `\$`, `%`, `\%`, `\!`,
// `\,` and `\text{...}` wrappers' braces, the text as a whole when it is a number (an optional
// sign, digits with optional thousands separators "1,234,567", an optional fraction part,
// an optional exponent), a fraction `a/b`, or `\frac{a}{b}` (also \dfrac, \tfrac) of such
// numbers; otherwise the last number in it. Numbers are decimal only: no hex, inf or nan.
#ifndef MARLAAS_MATH_ANSWER_H
#define MARLAAS_MATH_ANSWER_H

#include <stddef.h>

// Extracts the answer of len bytes of text (need not be NUL-terminated; any bytes). Returns 0
// and writes *out, or -1 when the text holds no number.
int math_answer(const char *text, size_t len, double *out);

#endif
