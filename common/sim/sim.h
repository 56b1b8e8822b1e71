// sim.h - the simulated accelerator backend (--backend sim:DEVICE): every engine step and
// training pass costs its modelled duration on a named device instead of being computed.
//
// What is modelled (sim_cost): each op the engine runs, from the model's shape and the batch:
//   GEMM of m rows, n out, k in:  max(2mnk / (flops * e(m)), bytes / (bandwidth * bw_eff)) + launch,
//                                 e(m) = gemm_efficiency * m / (m + gemm_half_rows),
//                                 bytes = the weights (n k weight_bytes) + the activations in and out;
//   attention: max(FLOPs / (flops * attention_efficiency), K/V bytes read / (bandwidth * bw_eff));
//   multi-LoRA: per adapter of the batch, shrink and expand GEMMs of its rows (its own weights read);
//   norms, RoPE, activation, residuals: their bytes; the LM head on the rows that need logits;
//   plus step_overhead per step (host work), and for training the backward (the frozen base's
//   input gradients only: as many GEMM FLOPs again; attention 2.5x its forward; LoRA 2x; all at
//   the device's backward_efficiency, 1 unless measured otherwise: a measured device whose
//   backward costs less than that model, as the CPU's since its attention backward takes 16
//   keys per vector, gets a figure above 1, at most 4) and the
//   optimiser over the adapters (16 bytes per parameter). A trainer of D devices splits a pass's
//   tokens over them and all-reduces the adapters' gradients (ring: 2 (D-1)/D of the bytes over
//   link_bandwidth, plus link_latency per device).
// Memory (sim_kv_blocks): device memory minus the weights, the resident adapters and the
// activation reserve holds the KV cache; the generator's real admission control then acts on
// those blocks exactly as on the device.
// Time: sim_wait sleeps the modelled duration divided by the time scale (default 60: an hour of
// device work in a minute), less the host work that overlaps it, so a service is busy in wall
// time the modelled fraction of its time; durations reported by services are wall seconds
// (modelled = wall x scale). Everything that is not modelled (the scheduler, Redis, ZeroMQ, the
// verifiers, the services' host code) takes its real time, which the scale magnifies: a
// millisecond of it counts as scale milliseconds of the modelled cluster.
// Parameters: common/sim/params.json (compiled in; sources stated there), extended or replaced
// entry by entry by the file MARLAAS_SIM_PARAMS names.
#ifndef MARLAAS_SIM_H
#define MARLAAS_SIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/formats/hfconfig.h"
#include "common/util/rng.h"

typedef struct {
    char name[32];
    double flops;            // peak dense FLOP/s in the weights' precision
    double bandwidth;        // memory read bandwidth, bytes/s
    double memory;           // bytes
    double link_bandwidth;   // between devices, bytes/s each way
    double weight_bytes;     // bytes per weight and per KV element (2: bf16)
    double gemm_efficiency, gemm_half_rows, bandwidth_efficiency, attention_efficiency, backward_efficiency;
    double launch_s, step_overhead_s, link_latency_s, activation_reserve;
    double host_overlap;     // 1: the host's work between steps overlaps the device's (asynchronous
                             // launches, a GPU); 0: it adds to it (the CPU computes both)
    double shared_cores;     // > 0: the device is this machine's CPU of that many cores, which its
                             // steps share with every other runnable process (sim_wait); 0: a
                             // device of its own (an accelerator)
} sim_device_t;

// Length distribution of completions: lognormal (median, sigma) in tokens, fixed, or uniform;
// a draw above max_new is cut there (the sample ends by length, as on a device).
typedef enum { SIM_LEN_LOGNORMAL = 0, SIM_LEN_FIXED = 1, SIM_LEN_UNIFORM = 2 } sim_len_kind_t;
typedef struct {
    sim_len_kind_t kind;
    double a, b;             // lognormal: median, sigma; fixed: a; uniform: a..b
} sim_lengths_t;

typedef struct {
    double scale;            // modelled seconds per wall second (> 0; default 60)
    const char *lengths;     // "lognormal:MEDIAN,SIGMA" | "fixed:N" | "uniform:A,B"; NULL: lognormal:200,0.8
    int devices;             // data-parallel devices behind this process (trainer); 0/1: one
    int weight_bytes;        // 0: the device's (2 or 4)
    double coalesce_s;       // wall seconds of decode steps one generator call may run back to back
                             // (gen_step; 0: 1 ms; < 0: one step per call); a shared-cores device
                             // (this machine's CPU) always runs one, as the real engine does
} sim_opts_t;

typedef struct sim sim_t;

// Every simulated token's log-prob (a draw between two equally likely tokens) and the entropy of
// its distribution: what the simulated generator reports and the simulated trainer reproduces.
#define SIM_LOGP (-0.69314718f)
#define SIM_ENTROPY 0.69314718f

// The device `name` (case-insensitive: h100, h200, a100, cpu, or one MARLAAS_SIM_PARAMS adds)
// for a model of config mc. NULL + err for an unknown device (the known ones named), a bad
// parameter file or option.
sim_t *sim_open(const char *name, const hf_config_t *mc, const sim_opts_t *o, char *err);
// The same for a device given field by field (calibration: bench/sim_calibrate.c).
sim_t *sim_open_with(const sim_device_t *d, const hf_config_t *mc, const sim_opts_t *o, char *err);
// Simulators of a shared-cores device (sim_device_t.shared_cores) of process pid (0: of every
// other process of this machine and uid) whose modelled step holds a core now; -1 without the
// shared table.
int sim_host_busy(int pid);
void sim_close(sim_t **s);
const sim_device_t *sim_device(const sim_t *s);
double sim_scale(const sim_t *s);
int sim_devices(const sim_t *s);

// One sequence of a step or pass: n_new rows computed this time, after `past` positions already
// in the cache (a shared prefix in training), n_logits rows needing logits, its adapter.
typedef struct {
    int n_new, past, n_logits;
    int slot;                // adapter slot, -1 = base
    int rank;                // the adapter's r (0 without one)
    unsigned targets;        // bit t set: LoRA on target t (lora_target_t order: q k v o gate up down)
} sim_seq_t;

typedef enum { SIM_INFER = 0, SIM_TRAIN = 1 } sim_mode_t;

// Modelled seconds of one engine step (SIM_INFER: decode rows and prefill chunks, logits of the
// rows asking) or one training pass (SIM_TRAIN: forward, backward, per-adapter optimiser step of
// n_adapters adapters of adapter_params parameters in all, the gradient all-reduce when devices > 1)
// on the device.
double sim_cost(const sim_t *s, const sim_seq_t *seqs, int n, sim_mode_t mode, int n_adapters,
                double adapter_params);
// Counts d modelled seconds and sleeps d / scale, less (on a device with host_overlap) the calling
// thread's CPU time since its last sim_wait (its host work overlaps the device's time, as
// asynchronous launches on a GPU do; host work longer than the step still shows). On a device with
// shared_cores (this machine's CPU) the step instead runs in slices of at most 1 ms, each at
// 1 / (1 + others / cores) of full speed, others = the CPU demand of the machine's other tasks in cores
// (/proc/stat less the calling thread, averaged over about 0.25 s) + the other simulators whose
// step holds a core (a table in shared memory, /dev/shm/marlaas-sim-cores-v2-UID) whose busy
// fraction is not above this one's (the kernel runs first the task that has run least): each of
// them on the step's core with probability 1 / cores, as the kernel's lazily balanced run queues
// place them. One thread per sim_t.
void sim_wait(sim_t *s, double d);
// Counts d modelled seconds towards the next sim_wait, which waits for them with its own (steps
// run back to back on the device, their host work done between them at once: one wake-up for
// several short steps, see gen_step).
void sim_defer(sim_t *s, double d);
// Modelled seconds counted by sim_defer and not yet waited for.
double sim_deferred(const sim_t *s);
// sim_opts_t.coalesce_s as it applies to this device (0: one step per generator call).
double sim_coalesce_s(const sim_t *s);
// Host CPU seconds sim_wait took off its sleeps.
double sim_hidden_seconds(const sim_t *s);
double sim_modelled_seconds(const sim_t *s);

// Weight bytes of the model on the device; bytes of one KV block of block_size positions.
double sim_weight_bytes(const sim_t *s);
double sim_kv_block_bytes(const sim_t *s, int block_size);
// KV blocks the device holds beside the weights, n_slots resident adapters of adapter_params
// each and the activation reserve; -1 + err when nothing is left (the model does not fit).
int64_t sim_kv_blocks(const sim_t *s, int block_size, int n_slots, double adapter_params, char *err);

// A simulated trainer's memory (per device): the weights, the activations of pass_rows / devices
// tokens (L (16 D + 4 F) values each, kept for the backward) and, per job held, an adapter of rank
// 16 on every target with its gradient and AdamW moments (16 bytes per parameter). Lowers
// *max_jobs to what fits (logged); -1 + err when not even one job fits.
int sim_trainer_fit(const sim_t *s, int pass_rows, int *max_jobs, char *err);

// A completion length drawn from the distribution (>= 1), cut at max_new.
int sim_length(const sim_t *s, rng_t *rng, int max_new);
int sim_lengths_parse(const char *spec, sim_lengths_t *out, char *err);

// --- synthetic tasks ----------------------------------------------------------------------------
// The learning curve of a simulated task (params.json "tasks"): after `steps` optimiser steps the
// success probability is ceiling - (ceiling - start) exp(-steps / tau), moved by +-noise per group.
typedef struct {
    double start, ceiling, tau, noise;
    int prompt;              // prompt length in characters (tokens with a character tokenizer)
} sim_curve_t;
// 0 and *c for a simulated task's name (sim-easy, sim-medium, sim-hard, or a parameter file's),
// -1 when the name is none.
int sim_task_curve(const char *task, sim_curve_t *c);
bool sim_is_task(const char *task);
// The reward (0 or 1) of sample `sample` of group `group` of a batch generated by the adapter
// trained `steps` steps, deterministic in (key, group, sample): key identifies the batch (its job
// and task id). Greedy evals pass group = the eval example, sample = 0 and no noise (eval = true).
float sim_reward(const sim_curve_t *c, double steps, uint64_t key, uint64_t group, uint64_t sample, bool eval);
double sim_curve_p(const sim_curve_t *c, double steps);
// A 64-bit key of a string (FNV-1a), for sim_reward's key.
uint64_t sim_key(const char *s);

// The parameter file's text (for tests and `marlaas sim-params`): the compiled-in params.json.
const char *sim_params_text(size_t *len);
// A model shape of params.json ("qwen3-8b", ...): 0 and the fields it gives (the rest of *mc
// untouched), -1 when unknown.
int sim_model_shape(const char *name, hf_config_t *mc, char *source, size_t n);

#endif
