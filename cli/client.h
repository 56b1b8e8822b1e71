// client.h - a client of the scheduler API (DEALER socket, one request at a time).
#ifndef MARLAAS_CLIENT_H
#define MARLAAS_CLIENT_H

#include "common/net/proto.h"

typedef struct client client_t;

// endpoint: tcp://HOST:PORT (a "*" host means this machine). token may be NULL.
client_t *client_new(const char *endpoint, const char *token, int timeout_ms, char *err);
void client_destroy(client_t **c);
// Sends op with args (freed by the call) and waits for the reply. 0 when the reply is ok
// (*rep filled; free with proto_rep_free), -1 + err for an error reply, a timeout or a
// malformed reply.
int client_call(client_t *c, const char *op, proto_args_t *args, proto_rep_t *rep, char *err);

// The API endpoint and tokens from flags/environment (MARLAAS_API, MARLAAS_TOKEN,
// MARLAAS_ADMIN_TOKEN), with the local cluster's run directory (MARLAAS_RUN_DIR, default
// run/) as the fallback: `marlaas up` writes run/env with them.
const char *client_endpoint(const char *flag);
const char *client_token(const char *flag);
const char *client_admin_token(const char *flag);
// The base model folder: the flag, else MARLAAS_MODEL (environment, then run/env, which
// `marlaas up --model` writes), else models/tiny.
const char *client_model(const char *flag);

#endif
