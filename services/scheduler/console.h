// console.h - the web console the scheduler serves on a port of its own (--set console=HOST:PORT
// or MARLAAS_CONSOLE; off by default): a login page for a tenant or the admin token, the jobs
// table, a job's curves, spec, samples, adapters and cancel button, several jobs' curves overlaid,
// and (admin only) the services' heartbeats.
//
// libmicrohttpd without a thread of its own: console_run serves whatever is waiting, from the
// scheduler's loop, so every request runs on the loop's thread with its Redis connection and goes
// through api_handle - the API's own authorization and operations; the console adds sessions, not
// rules. Sessions live in the scheduler's memory (a bounded table, 256-bit random ids from
// libsodium, 8 hours), in an HttpOnly SameSite=Strict cookie; a session's token is never sent back
// and never in a URL; state-changing requests need the session's CSRF token in X-CSRF-Token. The
// page, its script and its style are compiled into the binary (console_assets.h).
#ifndef MARLAAS_SCHEDULER_CONSOLE_H
#define MARLAAS_SCHEDULER_CONSOLE_H

#include <stddef.h>

#include "common/net/store.h"
#include "services/scheduler/api.h"

typedef struct console console_t;

#define CONSOLE_MAX_SESSIONS 256          // the whole table
#define CONSOLE_MAX_SESSIONS_PER_TOKEN 16 // one token's sessions: its 17th login ends its oldest
#define CONSOLE_SESSION_S (8 * 3600)      // a session's life from login (the cookie's Max-Age)
#define CONSOLE_MAX_BODY 4096             // bytes of a POST body (login, cancel, logout)

// Starts the console on setting ("HOST:PORT", "PORT", "off"/"0"/NULL: none). NULL + err when it
// cannot (err "" when off). api and st are borrowed.
console_t *console_start(const char *setting, api_t *api, store_t *st, char *err);
// Serves the requests waiting now (never blocks on the network); call every loop turn.
void console_run(console_t *c);
int console_port(const console_t *c);
void console_stop(console_t **c);

// One embedded file (generated from services/scheduler/console/ by scripts/embed_assets.sh).
typedef struct {
    const char *name;              // "index.html", "app.js", ...
    const unsigned char *data;
    size_t len;
} console_asset_t;
extern const console_asset_t console_assets[];
extern const size_t console_n_assets;

#endif
