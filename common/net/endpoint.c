// endpoint.c - endpoint checks: the syntax a tenant's endpoint may have, the operator's
// allow-list and the deny rules of the cluster's own ports (endpoint.h has the rules in full).
#include "common/net/endpoint.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util/util.h"

typedef enum { RULE_ANY, RULE_NAME, RULE_DOMAIN, RULE_NET, RULE_IPC, RULE_IPC_PREFIX } rule_kind_t;

typedef struct {
    rule_kind_t kind;
    char text[ENDPOINT_MAX];   // the entry as written, for messages
    char name[ENDPOINT_MAX];   // NAME: the name; DOMAIN: ".domain"; IPC: the path; IPC_PREFIX: its start
    int family, bits;          // NET: the block
    uint8_t addr[16];
    int port_lo, port_hi;      // tcp entries: 1..65535 unless the entry names ports
} rule_t;

typedef struct {
    int port;                  // tcp: refused on every host; 0 for an ipc path
    char path[ENDPOINT_MAX];
    char label[96];            // whose it is, for the refusal
} deny_t;

struct endpoint_rules {
    rule_t *allow;
    int n_allow;               // 0: no allow-list
    deny_t *deny;
    int n_deny;
};

// --- pieces of an endpoint ---------------------------------------------------------------------

// A port: 1 to 5 decimal digits without a leading zero, 1..65535 (libzmq reads "0" and "*" as
// "any port" when binding; neither names a service).
static int parse_port(const char *s, size_t n) {
    if (n == 0 || n > 5 || s[0] == '0') return -1;
    int p = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        p = p * 10 + (s[i] - '0');
    }
    return p <= 65535 ? p : -1;
}

static bool is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

// A dotted-quad IPv4 address (inet_pton: exactly four decimal parts, no leading zeros).
static bool parse_ipv4(const char *s, size_t n, uint8_t addr[16]) {
    char buf[64];
    if (n == 0 || n >= sizeof buf) return false;
    memcpy(buf, s, n), buf[n] = 0;
    memset(addr, 0, 16);
    return inet_pton(AF_INET, buf, addr) == 1;
}

// An IPv6 address without brackets; an IPv4-mapped one (::ffff:a.b.c.d) becomes IPv4.
static int parse_ipv6(const char *s, size_t n, int *family, uint8_t addr[16], char *err) {
    char buf[64];
    if (memchr(s, '%', n)) return err_set(err, "IPv6 zone ids (%%) are not allowed");
    if (n == 0 || n >= sizeof buf) return err_set(err, "'%.*s' is not an IPv6 address", (int)(n < 64 ? n : 64), s);
    memcpy(buf, s, n), buf[n] = 0;
    if (inet_pton(AF_INET6, buf, addr) != 1) return err_set(err, "'%s' is not an IPv6 address", buf);
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    *family = AF_INET6;
    if (!memcmp(addr, mapped, 12)) {
        memmove(addr, addr + 12, 4);
        memset(addr + 4, 0, 12);
        *family = AF_INET;
    }
    return 0;
}

// A host name: letters, digits, '-' and '_' in dot-separated labels of 1..63 bytes, 253 bytes in
// all; written out lower-cased without its trailing dot. A name whose last label is a number
// (127.1, 2130706433, 0x7f.1) is refused: the resolver would read it as an IPv4 address.
static int parse_name(const char *s, size_t n, char out[ENDPOINT_MAX], char *err) {
    if (n > 0 && s[n - 1] == '.') n--;
    if (n == 0) return err_set(err, "empty host");
    if (n > 253) return err_set(err, "host name longer than 253 bytes");
    size_t label = 0, last = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c >= 'A' && c <= 'Z') c = (char)(c - 'A' + 'a');
        if (c == '.') {
            if (label == 0) return err_set(err, "empty label in host name '%.*s'", (int)n, s);
            label = 0;
            last = i + 1;
        } else if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_') {
            if (++label > 63) return err_set(err, "label of more than 63 bytes in host name");
        } else {
            return err_set(err, "character '%c' not allowed in a host name", c);
        }
        out[i] = c;
    }
    if (label == 0) return err_set(err, "empty label in host name '%.*s'", (int)n, s);
    out[n] = 0;
    const char *tld = out + last;
    bool digits = true;
    for (const char *p = tld; *p; p++) digits &= *p >= '0' && *p <= '9';
    bool hex = tld[0] == '0' && tld[1] == 'x';
    for (const char *p = tld + 2; hex && *p; p++) hex &= is_hex(*p);
    if (digits || hex) return err_set(err, "'%s' is not a dotted-quad IPv4 address (the resolver would read it as one)", out);
    return 0;
}

// The host part of a tcp endpoint or an allow-list entry: [IPv6], IPv4 or a name.
static int parse_host(const char *s, size_t n, endpoint_t *e, char *err) {
    e->family = 0;
    memset(e->addr, 0, sizeof e->addr);
    if (n >= 2 && s[0] == '[' && s[n - 1] == ']') {
        if (parse_ipv6(s + 1, n - 2, &e->family, e->addr, err)) return -1;
        snprintf(e->host, sizeof e->host, "%.*s", (int)(n - 2), s + 1);
        return 0;
    }
    if (memchr(s, ':', n)) return err_set(err, "an IPv6 address goes in brackets: tcp://[ADDRESS]:PORT");
    if (parse_ipv4(s, n, e->addr)) {
        e->family = AF_INET;
        snprintf(e->host, sizeof e->host, "%.*s", (int)n, s);
        return 0;
    }
    return parse_name(s, n, e->host, err);
}

static bool unspecified(const endpoint_t *e) {
    static const uint8_t zero[16] = {0};
    return e->family && !memcmp(e->addr, zero, e->family == AF_INET ? 4 : 16);
}

int endpoint_parse(const char *ep, endpoint_t *e, char *err) {
    memset(e, 0, sizeof *e);
    if (!ep || !*ep) return err_set(err, "empty endpoint");
    size_t len = strlen(ep);
    if (len >= ENDPOINT_MAX) return err_set(err, "endpoint longer than %d bytes", ENDPOINT_MAX - 1);
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)ep[i] <= 0x20 || (unsigned char)ep[i] >= 0x7f)
            return err_set(err, "blank, control or non-ASCII byte at offset %zu", i);
    if (!strncmp(ep, "inproc://", 9))
        return err_set(err, "inproc:// is never allowed (it would reach sockets inside the verifier)");
    if (!strncmp(ep, "ipc://", 6)) {
        e->kind = ENDPOINT_IPC;
        if (!ep[6]) return err_set(err, "ipc:// needs a path");
        if (!strcmp(ep + 6, "*")) return err_set(err, "ipc://* binds a new path; a service to connect to needs its path");
        if (strchr(ep + 6, ',')) return err_set(err, "one endpoint, not a list");
        snprintf(e->path, sizeof e->path, "%s", ep + 6);
        return 0;
    }
    if (strncmp(ep, "tcp://", 6)) {
        const char *sep = strstr(ep, "://");
        if (sep) return err_set(err, "transport '%.*s' is not allowed (tcp:// or ipc://, lower case)", (int)(sep - ep < 16 ? sep - ep : 16), ep);
        return err_set(err, "not a ZeroMQ endpoint (tcp://HOST:PORT or ipc://PATH)");
    }
    e->kind = ENDPOINT_TCP;
    const char *h = ep + 6;
    size_t n = len - 6;
    // the tricks first, each with its own reason
    if (memchr(h, ',', n)) return err_set(err, "one endpoint, not a list");
    if (memchr(h, ';', n)) return err_set(err, "the source-address form tcp://SOURCE;HOST:PORT is not allowed");
    if (memchr(h, '@', n)) return err_set(err, "userinfo (user@host) is not part of a ZeroMQ endpoint");
    if (h[0] == '*') return err_set(err, "tcp://*:PORT is a bind address; a service to connect to needs its host");
    if (strpbrk(h, "/?#")) return err_set(err, "a tcp endpoint has no path or query");
    const char *colon = strrchr(h, ':'), *rb = strchr(h, ']');
    if (h[0] == '[' && !rb) return err_set(err, "'[' without ']'");
    if (!colon || (h[0] == '[' && colon < rb)) return err_set(err, "no port: tcp://HOST:PORT");
    size_t hn = (size_t)(colon - h);
    if ((e->port = parse_port(colon + 1, strlen(colon + 1))) < 0)
        return err_set(err, "port '%.16s' is not a number in 1..65535", colon + 1);
    if (h[0] == '[' && (hn < 2 || h[hn - 1] != ']')) return err_set(err, "an IPv6 address goes in brackets: tcp://[ADDRESS]:PORT");
    if (parse_host(h, hn, e, err)) return -1;
    if (unspecified(e)) return err_set(err, "the unspecified address %s means this host, not a service", e->host);
    return 0;
}

// --- rules --------------------------------------------------------------------------------------

// "N" or "N-M", 1 <= N <= M <= 65535.
static int parse_ports(const char *s, size_t n, int *lo, int *hi) {
    const char *dash = memchr(s, '-', n);
    *lo = parse_port(s, dash ? (size_t)(dash - s) : n);
    *hi = dash ? parse_port(dash + 1, n - (size_t)(dash - s) - 1) : *lo;
    return *lo > 0 && *hi >= *lo ? 0 : -1;
}

// An IP block: the address and a prefix length that leaves no host bits set.
static int parse_net(rule_t *r, const char *a, size_t an, const char *bits, size_t bn, bool bracketed, char *err) {
    endpoint_t e = {0};
    if (bracketed || memchr(a, ':', an)) {
        if (parse_ipv6(a, an, &e.family, e.addr, err)) return -1;
    } else if (parse_ipv4(a, an, e.addr)) {
        e.family = AF_INET;
    } else {
        return err_set(err, "'%.*s' is not an IP address", (int)(an < 64 ? an : 64), a);
    }
    bool mapped = e.family == AF_INET && (bracketed || memchr(a, ':', an));
    int max = e.family == AF_INET && !mapped ? 32 : 128, b = max;
    if (bits) {
        b = 0;
        if (bn == 0 || bn > 3) return err_set(err, "bad prefix length");
        for (size_t i = 0; i < bn; i++) {
            if (bits[i] < '0' || bits[i] > '9') return err_set(err, "bad prefix length");
            b = b * 10 + (bits[i] - '0');
        }
        if (b > max) return err_set(err, "prefix length %d is more than %d", b, max);
    }
    if (mapped) {
        // ::ffff:a.b.c.d/N: the IPv4 block a.b.c.d/(N - 96)
        if (b < 96) return err_set(err, "an IPv4-mapped block needs a prefix of at least 96");
        b -= 96;
    }
    r->kind = RULE_NET;
    r->family = e.family;
    r->bits = b;
    memcpy(r->addr, e.addr, 16);
    int bytes = e.family == AF_INET ? 4 : 16;
    for (int i = 0; i < bytes; i++) {
        int keep = b >= 8 * (i + 1) ? 8 : b > 8 * i ? b - 8 * i : 0;
        if (r->addr[i] & (uint8_t)(0xff >> keep))
            return err_set(err, "host bits set after the prefix (the block starts lower)");
    }
    return 0;
}

// One allow-list entry (trimmed, not empty).
static int parse_rule(rule_t *r, const char *s, size_t n, char *err) {
    memset(r, 0, sizeof *r);
    snprintf(r->text, sizeof r->text, "%.*s", (int)n, s);
    r->port_lo = 1, r->port_hi = 65535;
    if (n >= ENDPOINT_MAX) return err_set(err, "entry longer than %d bytes", ENDPOINT_MAX - 1);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] >= 0x7f) return err_set(err, "blank or control byte inside");
    if (n >= 6 && !strncmp(s, "ipc://", 6)) {
        if (n == 6) return err_set(err, "ipc:// needs a path");
        r->kind = s[n - 1] == '*' ? RULE_IPC_PREFIX : RULE_IPC;
        snprintf(r->name, sizeof r->name, "%.*s", (int)(n - 6 - (r->kind == RULE_IPC_PREFIX)), s + 6);
        return 0;
    }
    if (n >= 6 && !strncmp(s, "tcp://", 6)) s += 6, n -= 6;   // the transport may be written
    if (memmem(s, n, "://", 3)) return err_set(err, "only tcp:// and ipc:// entries");
    const char *host = s, *ports = NULL, *bits = NULL;
    size_t hn = n, pn = 0, bn = 0;
    bool bracketed = false;
    if (n > 0 && s[0] == '[') {
        const char *end = memchr(s, ']', n);
        if (!end) return err_set(err, "'[' without ']'");
        host = s + 1, hn = (size_t)(end - s) - 1, bracketed = true;
        const char *p = end + 1, *stop = s + n;
        if (p < stop && *p == '/') {
            bits = ++p;
            while (p < stop && *p != ':') p++;
            bn = (size_t)(p - bits);
        }
        if (p < stop && *p == ':') ports = p + 1, pn = (size_t)(stop - ports);
        else if (p < stop) return err_set(err, "unexpected '%c' after ']'", *p);
    } else if (memchr(s, '/', n)) {
        const char *slash = memchr(s, '/', n), *stop = s + n;
        hn = (size_t)(slash - s);
        bits = slash + 1;
        const char *c = memchr(bits, ':', (size_t)(stop - bits));
        bn = (size_t)((c ? c : stop) - bits);
        if (c) ports = c + 1, pn = (size_t)(stop - ports);
    } else {
        const char *c1 = memchr(s, ':', n), *c2 = c1 ? memchr(c1 + 1, ':', n - (size_t)(c1 - s) - 1) : NULL;
        if (c1 && !c2) hn = (size_t)(c1 - s), ports = c1 + 1, pn = n - hn - 1;
        // two colons or more: a bare IPv6 address, every port
    }
    if (ports && parse_ports(ports, pn, &r->port_lo, &r->port_hi))
        return err_set(err, "bad port or range '%.*s' (N or N-M within 1..65535)", (int)(pn < 16 ? pn : 16), ports);
    if (hn == 0) return err_set(err, "no host");
    if (bits || bracketed || memchr(host, ':', hn)) return parse_net(r, host, hn, bits, bn, bracketed, err);
    endpoint_t e;
    if (parse_ipv4(host, hn, e.addr)) return parse_net(r, host, hn, NULL, 0, false, err);
    if (hn == 1 && host[0] == '*') {
        r->kind = RULE_ANY;
        return 0;
    }
    bool domain = hn > 2 && host[0] == '*' && host[1] == '.';
    if (domain) host += 2, hn -= 2;
    if (memchr(host, '*', hn)) return err_set(err, "a '*' only as the whole host or a leading '*.'");
    if (parse_name(host, hn, r->name + domain, err)) return -1;
    if (domain) r->name[0] = '.';
    r->kind = domain ? RULE_DOMAIN : RULE_NAME;
    return 0;
}

endpoint_rules_t *endpoint_rules_new(const char *allow, char *err) {
    endpoint_rules_t *r = xcalloc(1, sizeof *r);
    const char *p = allow ? allow : "";
    bool blank = true;
    for (const char *q = p; *q; q++) blank &= *q == ' ' || *q == '\t' || *q == '\n' || *q == '\r';
    if (blank) return r;
    int cap = 0;
    for (int k = 1;; k++) {
        const char *end = strchr(p, ',');
        if (!end) end = p + strlen(p);
        const char *a = p, *b = end;
        while (a < b && (*a == ' ' || *a == '\t' || *a == '\n' || *a == '\r')) a++;
        while (b > a && (b[-1] == ' ' || b[-1] == '\t' || b[-1] == '\n' || b[-1] == '\r')) b--;
        char why[ERR_LEN];
        if (a == b) {
            err_set(err, "allow-list entry %d is empty", k);
            goto fail;
        }
        if (r->n_allow == cap) {
            cap = cap ? 2 * cap : 8;
            r->allow = xrealloc(r->allow, sizeof *r->allow * (size_t)cap);
        }
        if (parse_rule(&r->allow[r->n_allow], a, (size_t)(b - a), why)) {
            err_set(err, "allow-list entry %d '%.*s': %s", k, (int)(b - a < 64 ? b - a : 64), a, why);
            goto fail;
        }
        r->n_allow++;
        if (!*end) break;
        p = end + 1;
    }
    return r;
fail:
    endpoint_rules_destroy(&r);
    return NULL;
}

int endpoint_rules_deny(endpoint_rules_t *r, const char *what, const char *label, char *err) {
    const char *p = what ? what : "";
    while (*p) {
        const char *end = strchr(p, ',');
        if (!end) end = p + strlen(p);
        const char *a = p, *b = end;
        while (a < b && *a == ' ') a++;
        while (b > a && b[-1] == ' ') b--;
        size_t n = (size_t)(b - a);
        deny_t d = {0};
        snprintf(d.label, sizeof d.label, "%s", label ? label : "one of the cluster's own");
        if (n >= 9 && !strncmp(a, "inproc://", 9)) {
            // refused anyway
        } else if (n > 6 && !strncmp(a, "ipc://", 6)) {
            snprintf(d.path, sizeof d.path, "%.*s", (int)(n - 6), a + 6);
        } else if (n > 0) {
            const char *c = NULL;
            for (const char *q = a; q < b; q++)
                if (*q == ':') c = q;
            d.port = c ? parse_port(c + 1, (size_t)(b - c - 1)) : parse_port(a, n);
            if (d.port < 0) return err_set(err, "%s: '%.*s' names no port", d.label, (int)(n < 64 ? n : 64), a);
        }
        if (d.port > 0 || d.path[0]) {
            r->deny = xrealloc(r->deny, sizeof *r->deny * (size_t)(r->n_deny + 1));
            r->deny[r->n_deny++] = d;
        }
        p = *end ? end + 1 : end;
    }
    return 0;
}

void endpoint_rules_destroy(endpoint_rules_t **pr) {
    if (!pr || !*pr) return;
    free((*pr)->allow);
    free((*pr)->deny);
    free(*pr);
    *pr = NULL;
}

void endpoint_rules_describe(const endpoint_rules_t *r, char *out, size_t n) {
    size_t k = 0;
#define PUT(...) do { if (k < n) { int w = snprintf(out + k, n - k, __VA_ARGS__); k += w > 0 ? (size_t)w : 0; } } while (0)
    if (n) out[0] = 0;
    if (!r || !r->n_allow) PUT("no allow-list (any tcp host, no ipc)");
    else {
        PUT("allow-list");
        for (int i = 0; i < r->n_allow; i++) PUT("%s%s", i ? "," : " ", r->allow[i].text);
    }
    if (r && r->n_deny) {
        PUT("; refused on every host: ports");
        for (int i = 0; i < r->n_deny; i++) {
            bool seen = false;
            for (int j = 0; j < i; j++) seen |= r->deny[j].port == r->deny[i].port && !strcmp(r->deny[j].path, r->deny[i].path);
            if (seen) continue;
            if (r->deny[i].port) PUT(" %d", r->deny[i].port);
            else PUT(" ipc://%s", r->deny[i].path);
        }
    }
#undef PUT
}

// --- the check ----------------------------------------------------------------------------------

static bool net_match(const rule_t *r, const endpoint_t *e) {
    if (r->family != e->family) return false;
    int full = r->bits / 8, rem = r->bits % 8;
    if (memcmp(r->addr, e->addr, (size_t)full)) return false;
    return !rem || !((r->addr[full] ^ e->addr[full]) & (uint8_t)(0xff << (8 - rem)));
}

static bool host_match(const rule_t *r, const endpoint_t *e) {
    switch (r->kind) {
    case RULE_ANY: return true;
    case RULE_NET: return net_match(r, e);
    case RULE_NAME: return !e->family && !strcmp(r->name, e->host);
    case RULE_DOMAIN: {
        size_t hl = strlen(e->host), dl = strlen(r->name);
        return !e->family && hl > dl && !strcmp(e->host + hl - dl, r->name);
    }
    default: return false;
    }
}

bool endpoint_allowed(const char *ep, const endpoint_rules_t *r, char *err) {
    endpoint_t e;
    if (endpoint_parse(ep, &e, err)) return false;
    for (int i = 0; r && i < r->n_deny; i++) {
        const deny_t *d = &r->deny[i];
        if (e.kind == ENDPOINT_TCP && d->port == e.port) {
            err_set(err, "port %d is %s; the cluster's own ports are refused on every host", e.port, d->label);
            return false;
        }
        if (e.kind == ENDPOINT_IPC && d->path[0] && !strcmp(d->path, e.path)) {
            err_set(err, "ipc path %.100s is %s", e.path, d->label);
            return false;
        }
    }
    if (!r || !r->n_allow) {
        if (e.kind == ENDPOINT_IPC) {
            err_set(err, "ipc:// endpoints are refused unless the allow-list names them");
            return false;
        }
        return true;
    }
    const rule_t *port_miss = NULL;
    for (int i = 0; i < r->n_allow; i++) {
        const rule_t *a = &r->allow[i];
        if (e.kind == ENDPOINT_IPC) {
            if ((a->kind == RULE_IPC && !strcmp(a->name, e.path)) ||
                (a->kind == RULE_IPC_PREFIX && !strncmp(a->name, e.path, strlen(a->name))))
                return true;
            continue;
        }
        if (!host_match(a, &e)) continue;
        if (e.port >= a->port_lo && e.port <= a->port_hi) return true;
        if (!port_miss) port_miss = a;
    }
    if (port_miss) err_set(err, "port %d is outside the ports of allow-list entry '%.80s'", e.port, port_miss->text);
    else if (e.kind == ENDPOINT_IPC) err_set(err, "ipc path %.100s matches no entry of the allow-list", e.path);
    else err_set(err, "host %.100s matches no entry of the allow-list", e.host);
    return false;
}
