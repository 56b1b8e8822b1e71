// dp.h - data-parallel training steps: one trainer process per GPU (or per CPU host), the same
// model and adapters everywhere, each step's sequences split over the ranks, gradients summed.
//
// Rank 0 is the trainer service (Redis, sockets, jobs, publication); ranks 1.. are workers that
// hold replicas of the adapters and optimiser states and follow rank 0's commands, broadcast over
// a dist_t process group (dist.h):
//   load   an adapter slot's parameters and optimiser state (a job loaded or resumed by rank 0);
//   clear  a slot (the job left);
//   pass   one training pass: every sequence with its weights, behaviour log-probs, advantage and
//          shared-prefix links, the loss settings and the slots it steps;
//   ping   rank 0 is idle but alive (every second or so; the workers' deadline);
//   stop   rank 0 stops: the workers exit.
// Every rank receives the whole pass and trains its share: whole shared-prefix groups (a prompt
// and its samples stay together), assigned in order to the rank with the fewest rows so far, so
// every rank computes the same split. The loss is normalised by the whole pass's token weights
// per slot (loss_cfg_t.slot_weight), so the SUM of the ranks' gradients is the gradient of the
// single-process step; the sum is taken with NCCL on device memory (CUDA builds) or over the
// group (CPU), then every rank applies the same AdamW step to its replica, and the replicas stay
// identical bit for bit (the same summed gradient, the same kernels). Rank 0 publishes.
//
// Failures: a pass that a rank refuses (bad input: the engine's validation) is refused on every
// rank (the outcome is summed with the statistics before any gradient), and nothing steps. A dead,
// hung or diverging rank breaks the group: every operation has the group's deadline, the others
// fail with DP_BROKEN and a message naming it, and the processes exit so that their supervisor
// restarts the whole group (a rank cannot rejoin a formed group).
#ifndef MARLAAS_DP_H
#define MARLAAS_DP_H

#include <stdbool.h>

#include "common/engine/engine.h"
#include "common/engine/optim.h"

typedef struct dp dp_t;

enum { DP_REFUSED = -1, DP_BROKEN = -2 };

typedef struct {
    int rank, world;        // world 1: no group (dp_open returns NULL, err empty)
    const char *endpoint;   // rank 0's address, tcp://HOST:PORT (rank 0 binds its port)
    double timeout_s;       // deadline of every group operation; longer than the slowest pass
    bool host_sum;          // GPU backends: sum gradients on the host over the group instead of
                            // with NCCL (ranks that share a GPU, which NCCL refuses, or no NCCL)
} dp_cfg_t;

// Joins the group for engine e (its model, pool and backend). NULL + err on failure; NULL with
// err[0] == 0 for world 1.
dp_t *dp_open(const dp_cfg_t *c, engine_t *e, char *err);
// Rank 0 tells the workers to stop (best effort); then closes. Frees what a worker holds.
void dp_close(dp_t **d);
int dp_rank(const dp_t *d);
int dp_world(const dp_t *d);
// Seconds since the last group operation (rank 0 pings when idle for about a second).
double dp_idle_s(const dp_t *d);

// Rank 0: the adapter now in `slot` of the engine's pool and its optimiser state go to every rank.
// 0; DP_REFUSED + err when a rank could not take it (the slot is then empty on every worker);
// DP_BROKEN + err.
int dp_load(dp_t *d, int slot, const optim_t *o, char *err);
// Rank 0: the slot is free on every rank. 0 or DP_BROKEN + err.
int dp_clear(dp_t *d, int slot, char *err);
// Rank 0: a liveness round (the workers' deadline; a dead worker is found here). 0 or DP_BROKEN.
int dp_ping(dp_t *d, char *err);

// One training pass over seqs (as engine_train takes them; the loss settings in lc) that steps
// the adapter slots `slots`: grads[slot] (backend memory, the adapter's size) receives the pass's
// gradient for each of them (overwritten), stats[slot + 1] (for slot + 1 < n_stats) its loss
// statistics. With d == NULL (or world 1): this process computes everything (engine_train, with
// reference log-probs first when lc->kl_coef > 0). On rank 0 of a group: broadcasts the pass,
// trains its share and sums over the group; the workers call it through dp_serve.
// 0, DP_REFUSED + err (nothing accumulated; the group stays usable), DP_BROKEN + err.
int dp_pass(dp_t *d, engine_t *e, const engine_train_seq_t *seqs, int n, const loss_cfg_t *lc, float *const *grads,
            const int *slots, int n_slots, loss_stats_t *stats, int n_stats, char *err);

// Ranks 1..: follows rank 0 until it stops (0), `stopping` returns true (0), or the group breaks
// (DP_BROKEN + err). After each pass the worker applies the AdamW step to the stepped slots.
int dp_serve(dp_t *d, bool (*stopping)(void), char *err);
// Worker statistics: passes trained, sequences of this rank's shares.
void dp_counts(const dp_t *d, long *passes, long *seqs);

// The split of a pass: owner[i] = the rank that trains seqs[i]. -1 + err when a prefix link is
// invalid (the engine's rules: seqs[k] earlier, without a prefix of its own).
int dp_shard(const engine_train_seq_t *seqs, int n, int world, int *owner, char *err);

#endif
