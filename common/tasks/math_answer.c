// math_answer.c - see math_answer.h.
#include "common/tasks/math_answer.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

// Longest number text taken (digits, separators, point, exponent): beyond it a "number" is
// noise, and strtod's input stays small.
#define NUM_MAX 64
// Longest answer text normalised as a whole; a longer one is searched for its last number.
#define WHOLE_MAX 256

static bool digit(char c) { return c >= '0' && c <= '9'; }

// Last occurrence of needle (NUL-terminated) in s[0..n), or NULL.
static const char *last_of(const char *s, size_t n, const char *needle) {
    size_t k = strlen(needle);
    if (k > n) return NULL;
    for (size_t i = n - k + 1; i-- > 0;)
        if (memcmp(s + i, needle, k) == 0) return s + i;
    return NULL;
}

// Parses a number that starts at s[0] (sign allowed when sign is true): digits with optional
// thousands separators (groups of exactly three after a comma), optional fraction, optional
// exponent. Returns the bytes used (0 = no number) and writes *out.
static size_t number_at(const char *s, size_t n, bool sign, bool exponent, double *out) {
    char buf[NUM_MAX + 1];
    size_t i = 0, b = 0, int_digits = 0, frac_digits = 0;
    if (sign && i < n && (s[i] == '-' || s[i] == '+')) {
        if (s[i] == '-') buf[b++] = '-';
        i++;
    }
    while (i < n && b < NUM_MAX) {
        if (digit(s[i])) {
            buf[b++] = s[i++];
            int_digits++;
        } else if (s[i] == ',' && int_digits > 0 && i + 3 < n && digit(s[i + 1]) && digit(s[i + 2]) &&
                   digit(s[i + 3]) && (i + 4 >= n || !digit(s[i + 4]))) {
            i++;   // a thousands separator: ",ddd" and no fourth digit
        } else {
            break;
        }
    }
    if (i < n && s[i] == '.' && i + 1 < n && digit(s[i + 1])) {
        buf[b++] = s[i++];
        while (i < n && digit(s[i]) && b < NUM_MAX) buf[b++] = s[i++], frac_digits++;
    }
    if (int_digits + frac_digits == 0 || b >= NUM_MAX) return 0;
    if (exponent && i + 1 < n && (s[i] == 'e' || s[i] == 'E')) {
        size_t j = i + 1, eb = b;
        char tmp[NUM_MAX + 1];
        memcpy(tmp, buf, b);
        tmp[eb++] = 'e';
        if (j < n && (s[j] == '+' || s[j] == '-')) tmp[eb++] = s[j++];
        size_t ed = 0;
        while (j < n && digit(s[j]) && eb < NUM_MAX) tmp[eb++] = s[j++], ed++;
        if (ed > 0 && eb < NUM_MAX) {
            memcpy(buf, tmp, eb);
            b = eb;
            i = j;
        }
    }
    buf[b] = '\0';
    double v = strtod(buf, NULL);
    if (!isfinite(v)) return 0;
    *out = v;
    return i;
}

// The whole of s is one number.
static bool whole_number(const char *s, size_t n, double *out) {
    return n > 0 && number_at(s, n, true, true, out) == n;
}

// The whole of s is a number, a/b, or \frac{a}{b} (\dfrac, \tfrac), with an optional sign
// in front of a fraction.
static bool whole_value(const char *s, size_t n, double *out) {
    if (whole_number(s, n, out)) return true;
    double sign = 1.0;
    size_t i = 0;
    if (i < n && (s[i] == '-' || s[i] == '+')) sign = s[i++] == '-' ? -1.0 : 1.0;
    static const char *const fracs[] = {"\\frac{", "\\dfrac{", "\\tfrac{"};
    for (size_t f = 0; f < 3; f++) {
        size_t k = strlen(fracs[f]);
        if (n - i < k || memcmp(s + i, fracs[f], k) != 0) continue;
        const char *a = s + i + k, *end = s + n;
        const char *close = memchr(a, '}', (size_t)(end - a));
        if (!close || close + 1 >= end || close[1] != '{' || end[-1] != '}') return false;
        double x, y;
        if (!whole_number(a, (size_t)(close - a), &x) || !whole_number(close + 2, (size_t)(end - 1 - (close + 2)), &y) ||
            y == 0)
            return false;
        *out = sign * x / y;
        return true;
    }
    const char *slash = memchr(s + i, '/', n - i);
    if (slash) {
        double x, y;
        if (whole_number(s + i, (size_t)(slash - (s + i)), &x) &&
            whole_number(slash + 1, (size_t)(s + n - slash - 1), &y) && y != 0) {
            *out = sign * x / y;
            return true;
        }
    }
    return false;
}

// The last number in s[0..n): a sign counts when it does not follow a letter, digit or
// closing bracket (so "3-2" is 3 then 2, "x = -2" is -2).
static bool last_number(const char *s, size_t n, double *out) {
    bool found = false;
    for (size_t i = 0; i < n;) {
        bool starts = digit(s[i]) && (i == 0 || (!digit(s[i - 1]) && s[i - 1] != '.'));
        if (!starts) {
            i++;
            continue;
        }
        size_t from = i;
        if (i > 0 && s[i - 1] == '-') {
            char before = i > 1 ? s[i - 2] : ' ';
            bool operand = digit(before) || (before >= 'a' && before <= 'z') || (before >= 'A' && before <= 'Z') ||
                           before == ')' || before == ']' || before == '}';
            if (!operand) from = i - 1;
        }
        double v;
        size_t used = number_at(s + from, n - from, true, false, &v);
        if (used == 0) {
            i++;
            continue;
        }
        *out = v;
        found = true;
        i = from + used;
        while (i < n && digit(s[i])) i++;   // the rest of an over-long number
    }
    return found;
}

// Copies s without spaces, $, \$, %, \%, \!, \, \; \: and the words \text / \mathrm (their
// braces stay, and are dropped when they enclose the whole). Returns the length, or -1 when
// the result does not fit cap.
static long normalise(const char *s, size_t n, char *out, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        char c = s[i];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '$' || c == '%') {
            i++;
            continue;
        }
        if (c == '\\' && i + 1 < n && strchr("$%!,;: ", s[i + 1])) {
            i += 2;
            continue;
        }
        if (c == '\\' && n - i >= 5 && memcmp(s + i, "\\text", 5) == 0) {
            i += 5;
            continue;
        }
        if (c == '\\' && n - i >= 7 && memcmp(s + i, "\\mathrm", 7) == 0) {
            i += 7;
            continue;
        }
        if (o + 1 >= cap) return -1;
        out[o++] = c;
        i++;
    }
    // {X} -> X, repeatedly (the braces \text left, or a group around the whole answer)
    size_t a = 0;
    while (o - a >= 2 && out[a] == '{' && out[o - 1] == '}') a++, o--;
    memmove(out, out + a, o - a);
    out[o - a] = '\0';
    return (long)(o - a);
}

int math_answer(const char *text, size_t len, double *out) {
    if (!text || !out) return -1;
    const char *region = text;
    size_t n = len;
    const char *boxed = last_of(text, len, "\\boxed{");
    const char *fbox = last_of(text, len, "\\fbox{");
    if (fbox && (!boxed || fbox > boxed)) boxed = fbox;
    const char *hashes = last_of(text, len, "####");
    if (boxed) {
        const char *open = strchr(boxed, '{');
        const char *p = open + 1, *end = text + len;
        int depth = 1;
        while (p < end && depth > 0) {
            if (*p == '{') depth++;
            else if (*p == '}') depth--;
            if (depth > 0) p++;
        }
        region = open + 1;
        n = (size_t)(p - region);   // an unclosed box: to the end of the text
    } else if (hashes) {
        region = hashes + 4;
        n = (size_t)(text + len - region);
    }
    char buf[WHOLE_MAX];
    long k = n < WHOLE_MAX ? normalise(region, n, buf, sizeof buf) : -1;
    if (k > 0 && whole_value(buf, (size_t)k, out)) return 0;
    return last_number(region, n, out) ? 0 : -1;
}
