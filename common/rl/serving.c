// serving.c - the context and KV cache a runtime serves, from the model's config and the settings
// (rl.h states the rule). Apart from the runtime so that the scheduler, which checks job specs
// against these limits at submission, computes them without the engine.
#include <stdint.h>

#include "common/rl/rl.h"

// The settings with their defaults filled in (rl.h states the rule); -1 + err for a max_context
// the model does not have.
int rl_serving_cfg(const hf_config_t *mc, const rl_runtime_cfg_t *c, rl_runtime_cfg_t *d, char *err) {
    *d = c ? *c : (rl_runtime_cfg_t){0};
    int model_ctx = hf_config_context(mc);
    if (d->n_slots <= 0) d->n_slots = 8;
    if (d->max_seqs <= 0) d->max_seqs = 512;
    if (d->max_context < 0 || d->max_context > model_ctx)
        return err_set(err, "max_context %d: the model computes %d positions at most", d->max_context, model_ctx);
    if (d->max_context == 0) d->max_context = model_ctx < RL_DEFAULT_CONTEXT ? model_ctx : RL_DEFAULT_CONTEXT;
    if (d->kv_mb <= 0) d->kv_mb = RL_DEFAULT_KV_MB;
    if (d->kv_blocks <= 0) {
        size_t per_block = 2 * sizeof(float) * 16 * (size_t)mc->num_hidden_layers * (size_t)mc->num_key_value_heads *
                           (size_t)mc->head_dim;
        size_t ctx_blocks = ((size_t)d->max_context + 15) / 16, budget = ((size_t)d->kv_mb << 20) / per_block;
        size_t n = budget < ctx_blocks + 2 ? ctx_blocks + 2 : budget;
        if (n > 256 * ctx_blocks) n = 256 * ctx_blocks;
        if (n > INT32_MAX / 2) n = INT32_MAX / 2;
        d->kv_blocks = (int)n;
    }
    if (d->max_batch_tokens <= 0) d->max_batch_tokens = 512;
    return 0;
}
