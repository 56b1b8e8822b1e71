// peft.h - LoRA adapter layout of Hugging Face PEFT: `adapter_config.json` and the tensor names
// of `adapter_model.safetensors`:
//   base_model.model.model.layers.{i}.self_attn.{q,k,v,o}_proj.lora_{A,B}.weight
//   base_model.model.model.layers.{i}.mlp.{gate,up,down}_proj.lora_{A,B}.weight
// lora_A has shape (r, in_features), lora_B has shape (out_features, r);
// the update is  y += (alpha / r) * x A^T B^T.
#ifndef MARLAAS_PEFT_H
#define MARLAAS_PEFT_H

#include <stddef.h>

#include "common/util/util.h"

typedef enum { LORA_Q = 0, LORA_K, LORA_V, LORA_O, LORA_GATE, LORA_UP, LORA_DOWN, LORA_N_TARGETS } lora_target_t;

#define LORA_ALL_TARGETS ((1u << LORA_N_TARGETS) - 1)

typedef struct {
    int r;                        // rank >= 1
    float alpha;                  // lora_alpha
    unsigned targets;             // bit mask of lora_target_t
    char base_model[256];         // base_model_name_or_path (informational)
} peft_config_t;

// "q_proj", "k_proj", ..., "down_proj"
const char *peft_target_name(lora_target_t t);
// Parses a target name ("q_proj" or "q"), returns the target or -1.
int peft_target_parse(const char *name);
// Writes the PEFT tensor name of (layer, target, 'A' or 'B') into buf.
void peft_tensor_name(char *buf, size_t n, int layer, lora_target_t t, char ab);

// adapter_config.json: requires peft_type "LORA", r > 0, lora_alpha, target_modules (list of
// names; unknown names are errors). Returns 0 or -1 with err.
int peft_config_parse(peft_config_t *cfg, const char *json, char *err);
int peft_config_load(peft_config_t *cfg, const char *path, char *err);
int peft_config_save(const peft_config_t *cfg, const char *path, char *err);

#endif
