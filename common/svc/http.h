// http.h - the HTTP endpoint every service serves next to its ZeroMQ sockets (libmicrohttpd,
// one internal thread): GET /healthz (liveness), GET /readyz (readiness), GET /metrics
// (Prometheus text format 0.0.4) from a metrics_t registry. Anything else: 404; methods other
// than GET and HEAD: 405.
#ifndef MARLAAS_HTTP_H
#define MARLAAS_HTTP_H

#include "common/svc/metrics.h"

typedef struct http_srv http_srv_t;

// Parses a listen setting: "PORT" (all interfaces), "HOST:PORT", or "0" / "off" (no HTTP).
// Returns 1 and fills host/port, 0 for off, -1 + err when malformed.
int http_parse_listen(const char *listen, char *host, size_t n_host, int *port, char *err);
// Starts serving m on the given setting. NULL + err (port in use, bad address); NULL and err ""
// when the setting is "0" / "off".
http_srv_t *http_start(const char *listen, metrics_t *m, char *err);
// The port served (0 for NULL).
int http_port(const http_srv_t *h);
void http_stop(http_srv_t **h);

#endif
