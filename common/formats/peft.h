// peft.h - LoRA adapter layout of Hugging Face PEFT: `adapter_config.json` and the tensor names
// of `adapter_model.safetensors`:
//   base_model.model.model.layers.{i}.self_attn.{q,k,v,o}_proj.lora_{A,B}.weight
//   base_model.model.model.layers.{i}.mlp.{gate,up,down}_proj.lora_{A,B}.weight
// lora_A has shape (r, in_features), lora_B has shape (out_features, r);
// the update is  y += (alpha / r) * x A^T B^T.
#ifndef MARLAAS_PEFT_H
#define MARLAAS_PEFT_H

#include <stddef.h>

#include "common/formats/safetensors.h"
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
// The adapter_config.json text peft_config_save writes (caller frees), or NULL with err (what is
// invalid, without a file name).
char *peft_config_json(const peft_config_t *cfg, char *err);

// An adapter blob (the stored form of a job's adapter, lora_serialize): a safetensors buffer with
// the PEFT tensor names, fp32 values, and the metadata lora_r, lora_alpha and lora_targets (the
// mask of lora_target_t). Reads its configuration (base_model left empty); -1 with err when the
// metadata is missing or malformed.
int peft_blob_config(const st_file_t *f, peft_config_t *cfg, char *err);

// The blob as one PEFT adapter in a tar archive (POSIX ustar): DIR/adapter_config.json (the blob's
// configuration naming base_model, which may be NULL) and DIR/adapter_model.safetensors (the
// blob's tensors, in its order, with the metadata {"format": "pt"}) - the same two files, byte for
// byte, that lora_save writes for the adapter. The blob is checked first: every tensor fp32 with
// a PEFT name. Returns 0 with *out (caller frees) or -1 with err.
int peft_archive_tar(const void *blob, size_t len, const char *base_model, const char *dir, uint8_t **out,
                     size_t *out_len, char *err);

#endif
