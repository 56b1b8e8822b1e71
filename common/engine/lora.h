// lora.h - LoRA adapters, the pool of resident adapters, and the per-step multi-LoRA plan.
//
// An adapter's parameters live in one arena (backend memory): for each enabled target t,
// A_t (L, r, in_t) then B_t (L, r, out_t). B is kept TRANSPOSED with respect to PEFT's
// lora_B (out, r): the expand step then adds rank rows of length `out` to each output row,
// which vectorises, instead of `out` dot products of length r. Files and blobs use the PEFT
// layout; load and save transpose. Gradients and AdamW moments use the in-memory layout
// (lora_point on another arena of n_params floats).
//
// Multi-LoRA (SGMV style): the engine orders a batch's rows so that rows using the same slot
// are contiguous, and a lora_plan_t lists the segments (slot, first row, row count). The base
// GEMM runs once over all rows; each segment then adds  scale * (X_seg A^T) B^T  with two small
// GEMMs on a contiguous block of rows (shrink to rank r, expand back), so no gather or scatter
// is needed and adapters of different ranks mix freely in one batch.
#ifndef MARLAAS_LORA_H
#define MARLAAS_LORA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/formats/hfconfig.h"
#include "common/formats/peft.h"
#include "kernels/kernels.h"

typedef struct {
    peft_config_t cfg;           // r, alpha, targets
    hf_config_t model;           // the base model's config (shapes of every target)
    int n_layers;
    float scale;                 // alpha / r
    const kernels_t *k;
    float *params;               // arena (backend memory)
    size_t n_params;
    float *A[LORA_N_TARGETS];    // (L, r, in_t)   NULL when the target is off
    float *B[LORA_N_TARGETS];    // (L, r, out_t)  transposed lora_B
    bool modelled;               // an adapter of the simulated backend: a configuration without
                                 // parameters (n_params 0, params, A and B NULL); see lora_modelled_serialize
    // A copy of params rounded to bf16 (same layout), made by lora_pool_set in a pool with
    // lora_pool_bf16_copies on; NULL otherwise. Decode steps of many adapters read it instead of
    // params (kern_lora_seg_t A16/B16): half the bytes.
    uint16_t *params16;
    uint16_t *A16[LORA_N_TARGETS], *B16[LORA_N_TARGETS];
} lora_t;

// in/out features of target t for the model config.
void lora_target_dims(const hf_config_t *m, lora_target_t t, int *in, int *out);
size_t lora_param_count(const hf_config_t *m, const peft_config_t *c);
// Points A/B into an arena laid out as described above.
void lora_point(float *A[LORA_N_TARGETS], float *B[LORA_N_TARGETS], float *arena, const hf_config_t *m,
                const peft_config_t *c);

// New adapter: A uniform(-1/sqrt(in), 1/sqrt(in)) (PEFT's kaiming-uniform default), B = 0, so
// a fresh adapter leaves the base model unchanged. Deterministic for a seed.
lora_t *lora_new(const hf_config_t *m, const peft_config_t *c, const kernels_t *k, uint64_t seed, char *err);
// Loads DIR/adapter_config.json + DIR/adapter_model.safetensors (PEFT layout).
lora_t *lora_load(const char *dir, const hf_config_t *m, const kernels_t *k, char *err);
int lora_save(const lora_t *a, const char *dir, char *err);
// Self-contained safetensors image (r, alpha and targets in __metadata__) for Redis blobs.
int lora_serialize(const lora_t *a, uint8_t **buf, size_t *len, char *err);
// The blob of lora_new(m, c, any backend, seed), byte for byte, built on the host: a job's version
// 0 is made by the scheduler at submission without a backend (it links no BLAS).
int lora_initial_serialize(const hf_config_t *m, const peft_config_t *c, uint64_t seed, uint8_t **buf, size_t *len,
                           char *err);
lora_t *lora_deserialize(const void *buf, size_t len, const hf_config_t *m, const kernels_t *k, char *err);
// The blob of a modelled adapter (the simulated backend's, common/sim/sim.h): the configuration
// of an adapter c on model m, with the metadata marlaas_modelled = "1" and no tensor; its cost is
// modelled from lora_param_count(m, c). lora_deserialize gives it back as a modelled lora_t on
// kernels_sim() only, and refuses it on any other backend (it has no weights); lora_serialize of
// a modelled adapter writes it again; lora_save refuses it.
int lora_modelled_serialize(const hf_config_t *m, const peft_config_t *c, uint8_t **buf, size_t *len, char *err);
lora_t *lora_clone(const lora_t *a);
void lora_destroy(lora_t **a);

// --- pool --------------------------------------------------------------------------------------
typedef struct lora_pool lora_pool_t;

lora_pool_t *lora_pool_new(int n_slots);
void lora_pool_destroy(lora_pool_t **p);
int lora_pool_slots(const lora_pool_t *p);
// Installs *a in slot (ownership moves to the pool, *a = NULL); the adapter previously in the
// slot is destroyed. Other slots are untouched, so rows using them keep computing between
// steps. -1 + err for a bad slot or an adapter made for another layer count.
int lora_pool_set(lora_pool_t *p, int slot, lora_t **a, char *err);
void lora_pool_clear(lora_pool_t *p, int slot);
lora_t *lora_pool_get(const lora_pool_t *p, int slot);   // NULL when empty or out of range
// Inference on a bf16 model: every adapter installed from now on (and every one already in the
// pool) gets a bf16 copy of its parameters, which decode steps of fewer than 8 rows per adapter
// read in place of the fp32 ones (lora_forward without saved outputs, kern_lora_seg_t A16/B16;
// within the tolerance of bf16 weights). The copy is made once, at installation: a pool whose
// adapters change in place (a trainer's) must not turn this on. Off by default.
void lora_pool_bf16_copies(lora_pool_t *p, bool on);

// --- plan ----------------------------------------------------------------------------------------
typedef struct {
    int slot;       // -1 = no adapter
    int row0;       // first row
    int n_rows;
} lora_segment_t;

typedef struct {
    lora_segment_t *seg;
    int n_seg, cap;
    int max_rank;   // largest rank among the segments' adapters (row stride of saved shrink outputs)
} lora_plan_t;

// Builds segments from a per-row slot array that is already grouped (equal slots contiguous).
// Slots that are empty in the pool are an error (-1 + err).
int lora_plan_build(lora_plan_t *plan, const int *row_slot, int n_rows, const lora_pool_t *pool, char *err);
void lora_plan_free(lora_plan_t *plan);

// Y (N, out) += sum over segments of scale * (X A_l^T) B_l for target t at layer l. X, Y, T and
// scratch are backend memory of k (the adapters' table); the plan is host memory.
// X is (N, in). When T is not NULL it receives the shrink outputs (N, plan->max_rank) for backward.
void lora_forward(const kernels_t *k, const lora_plan_t *plan, const lora_pool_t *pool, int layer, lora_target_t t,
                  const float *X, int in, float *Y, int out, float *T, float *scratch);
// Backward of lora_forward: dX (N, in) += ..., and for every segment whose slot has a gradient
// arena in grads[slot] (same layout as the adapter, backend memory; NULL = frozen) dA, dB accumulate.
// T are the saved shrink outputs; scratch holds N * max_rank floats.
void lora_backward(const kernels_t *k, const lora_plan_t *plan, const lora_pool_t *pool, float *const *grads,
                   int layer, lora_target_t t, const float *X, int in, const float *dY, int out, const float *T,
                   float *dX, float *scratch);

#endif
