// endpoint.h - which ZeroMQ endpoints a tenant may make the cluster connect to. A job names its
// reward or environment service (spec reward.endpoint / env.endpoint) and the verifier connects
// to it, so without a check a tenant could point the cluster at whatever the verifier can reach:
// Redis, the services' own ports, other internal hosts. An operator's allow-list says where
// tenants' services may live; deny rules (the cluster's own ports) hold whatever it says.
//
// Endpoints: tcp://HOST:PORT, HOST a DNS name, a dotted-quad IPv4 address or an IPv6 address in
// brackets, PORT 1..65535 in decimal; ipc://PATH. Everything else is refused with the reason:
// other transports (lower case only, as libzmq spells them), inproc:// (always: it would reach
// sockets inside the verifier itself), tcp://*:PORT (a bind wildcard), libzmq's source-address
// form tcp://SRC;HOST:PORT, lists, userinfo (user@host), blanks and control bytes, IPv4 in any
// form but the dotted quad (127.1, 0x7f.0.0.1, 2130706433: the resolver takes them as
// addresses), the unspecified address (0.0.0.0, [::]: a connect reaches the local host), IPv6
// zone ids, and endpoints of ENDPOINT_MAX bytes or more.
//
// Allow-list: comma-separated entries (blanks around an entry ignored), each optionally limited
// to a port or a port range (":9100", ":9100-9199"):
//   10.0.0.0/8  192.168.4.7  fd00::/8  [fd00::1]  [fd00::]/8:9100
//                  IP addresses and blocks; they match IP literals only (an IPv4-mapped IPv6
//                  address counts as its IPv4 address)
//   reward-svc  *.rewards.example.com
//                  a host name, or any name below a domain (not the domain itself); they match
//                  names only, case-insensitively, a trailing dot ignored. Names are not
//                  resolved: allowing a name trusts whoever controls its DNS records
//   *              any host
//   ipc:///run/rewards/r.sock  ipc:///run/rewards/*
//                  an ipc path, or every path that starts with the text before the '*'
// With no allow-list (NULL or blank) every tcp host is allowed and ipc:// is refused; with one,
// an endpoint must match an entry. Deny rules refuse a port on every host (the cluster's
// services answer under many names: localhost, their addresses, their DNS names) and an ipc
// path exactly; they hold with or without an allow-list.
#ifndef MARLAAS_ENDPOINT_H
#define MARLAAS_ENDPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ENDPOINT_MAX 256   // bytes of an endpoint with its NUL (a job spec's endpoint field)

typedef enum { ENDPOINT_TCP = 1, ENDPOINT_IPC = 2 } endpoint_kind_t;

typedef struct {
    endpoint_kind_t kind;
    char host[ENDPOINT_MAX];   // tcp: a name lower-cased without its trailing dot, or the IP
                               // literal as written (IPv6 without the brackets)
    int family;                // tcp: AF_INET or AF_INET6 for an IP literal, 0 for a name
    uint8_t addr[16];          // the literal's address (IPv4 in the first 4 bytes; an
                               // IPv4-mapped IPv6 address is stored as IPv4)
    int port;                  // tcp: 1..65535
    char path[ENDPOINT_MAX];   // ipc: the path
} endpoint_t;

typedef struct endpoint_rules endpoint_rules_t;

// Parses and checks one endpoint (the syntax above). 0, or -1 + err saying what is wrong.
int endpoint_parse(const char *ep, endpoint_t *out, char *err);

// Rules from an allow-list (NULL or blank: none). NULL + err naming the bad entry.
endpoint_rules_t *endpoint_rules_new(const char *allow, char *err);
// Adds deny rules: what is a comma-separated list of tcp://HOST:PORT, HOST:PORT or PORT (the
// port is refused on every host) and ipc://PATH (that path); label says whose it is in refusals
// ("Redis (--redis)"). 0, or -1 + err when an item has no port or path.
int endpoint_rules_deny(endpoint_rules_t *r, const char *what, const char *label, char *err);
// Accepts NULL; sets *r to NULL.
void endpoint_rules_destroy(endpoint_rules_t **r);
// One line for the log: the allow-list (or "any tcp host") and the denied ports.
void endpoint_rules_describe(const endpoint_rules_t *r, char *out, size_t n);

// True when ep parses and the rules (NULL: none) let the cluster connect to it; otherwise false
// and err names the rule that refused it (the deny rule's label, the allow-list).
bool endpoint_allowed(const char *ep, const endpoint_rules_t *r, char *err);

#endif
