// test_model.c - model and adapter files: bit-exact round trips (HF safetensors, PEFT files,
// Redis blobs), F16/BF16 checkpoints, and clear errors for damaged model folders.
#include <criterion/criterion.h>
#include <stdlib.h>

#include "common/formats/safetensors.h"
#include "testutil.h"

static void write_bytes(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    if (n) fwrite(b, 1, n, f);
    fclose(f);
}

Test(model, save_load_round_trip_is_bit_exact) {
    char dir[256], err[ERR_LEN];
    tu_tmpdir(dir, sizeof dir, "model-rt");
    for (int tie = 0; tie <= 1; tie++) {
        hf_config_t c = tu_config();
        c.tie_word_embeddings = tie;
        c.qkv_bias = !tie;
        snprintf(c.model_type, sizeof c.model_type, "%s", tie ? "llama" : "qwen2");
        model_t *m = tu_model(&c, 7 + tie);
        m->params[3] = -0.0f;
        cr_assert_eq(model_save(m, dir, err), 0, "%s", err);
        model_t *m2 = model_load(dir, kernels_cpu(), err);
        cr_assert_not_null(m2, "%s", err);
        cr_assert_eq(m2->n_params, m->n_params);
        cr_assert_eq(memcmp(m->params, m2->params, sizeof(float) * m->n_params), 0);
        cr_assert_eq(m2->cfg.tie_word_embeddings, tie);
        cr_assert_eq(m2->cfg.qkv_bias, !tie);
        model_destroy(&m);
        model_destroy(&m2);
    }
}

Test(model, reads_bf16_checkpoint) {
    // A BF16 checkpoint written by hand: every value exactly representable, so the fp32
    // model must hold exactly these numbers.
    char dir[256], path[512], err[ERR_LEN];
    tu_tmpdir(dir, sizeof dir, "model-bf16");
    hf_config_t c = tu_config();
    model_t *m = tu_model(&c, 9);
    for (size_t i = 0; i < m->n_params; i++) {
        uint32_t u;
        memcpy(&u, &m->params[i], 4);
        u &= 0xFFFF0000u;   // truncate to bf16
        memcpy(&m->params[i], &u, 4);
    }
    cr_assert_eq(model_save(m, dir, err), 0, "%s", err);
    // rewrite model.safetensors as BF16: header dtype and halved data
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    st_file_t *f = st_open(path, err);
    cr_assert_not_null(f, "%s", err);
    size_t total = 0;
    for (int i = 0; i < st_count(f); i++) total += st_tensor(f, i)->nbytes / 2;
    uint16_t *data = malloc(total * 2);
    char *hdr = malloc(1 << 20);
    int hn = snprintf(hdr, 1 << 20, "{");
    size_t off = 0;
    for (int i = 0; i < st_count(f); i++) {
        const st_tensor_t *t = st_tensor(f, i);
        size_t n = t->nbytes / 4;
        float *tmp = malloc(t->nbytes);
        cr_assert_eq(st_read_f32(f, t->name, t->ndim, t->shape, tmp, err), 0, "%s", err);
        for (size_t j = 0; j < n; j++) {
            uint32_t u;
            memcpy(&u, &tmp[j], 4);
            data[off / 2 + j] = (uint16_t)(u >> 16);
        }
        free(tmp);
        hn += snprintf(hdr + hn, (1 << 20) - hn, "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[", i ? "," : "", t->name);
        for (int d = 0; d < t->ndim; d++) hn += snprintf(hdr + hn, (1 << 20) - hn, "%s%lld", d ? "," : "", (long long)t->shape[d]);
        hn += snprintf(hdr + hn, (1 << 20) - hn, "],\"data_offsets\":[%zu,%zu]}", off, off + n * 2);
        off += n * 2;
    }
    hn += snprintf(hdr + hn, (1 << 20) - hn, "}");
    st_close(&f);
    uint64_t hl = (uint64_t)hn;
    FILE *o = fopen(path, "wb");
    fwrite(&hl, 8, 1, o);
    fwrite(hdr, 1, (size_t)hn, o);
    fwrite(data, 1, off, o);
    fclose(o);
    model_t *m2 = model_load(dir, kernels_cpu(), err);
    cr_assert_not_null(m2, "%s", err);
    cr_assert_eq(memcmp(m->params, m2->params, sizeof(float) * m->n_params), 0);
    free(hdr), free(data);
    model_destroy(&m);
    model_destroy(&m2);
}

Test(model, damaged_model_folders_give_clear_errors) {
    char dir[256], path[512], err[ERR_LEN];
    tu_tmpdir(dir, sizeof dir, "model-bad");
    hf_config_t c = tu_config();
    model_t *m = tu_model(&c, 1);
    cr_assert_eq(model_save(m, dir, err), 0, "%s", err);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    size_t len;
    char *good = util_read_file(path, &len, err);
    cr_assert_not_null(good);
    // truncated at many lengths: never a crash, always an error naming the file
    for (size_t cut = 0; cut < len; cut += len / 97 + 1) {
        write_bytes(path, good, cut);
        model_t *b = model_load(dir, kernels_cpu(), err);
        cr_assert_null(b, "truncated at %zu loaded", cut);
        cr_assert(strstr(err, "model.safetensors"), "cut %zu: %s", cut, err);
    }
    // bad header
    write_bytes(path, "\x10\0\0\0\0\0\0\0{not json here}", 24);
    cr_assert_null(model_load(dir, kernels_cpu(), err));
    write_bytes(path, good, len);
    // a config that does not match the weights: wrong shape named
    hf_config_t c2 = c;
    c2.intermediate_size = 40;
    snprintf(path, sizeof path, "%s/config.json", dir);
    cr_assert_eq(hf_config_save(&c2, path, err), 0);
    cr_assert_null(model_load(dir, kernels_cpu(), err));
    cr_assert(strstr(err, "shape"), "%s", err);
    // a config that needs a tensor the file lacks (qkv bias off -> on is covered by llama->qwen2)
    hf_config_t c3 = c;
    c3.num_hidden_layers = 3;
    cr_assert_eq(hf_config_save(&c3, path, err), 0);
    cr_assert_null(model_load(dir, kernels_cpu(), err));
    cr_assert(strstr(err, "model.layers.2"), "%s", err);
    // missing files
    cr_assert_null(model_load("build/test-tmp/no-such-model", kernels_cpu(), err));
    cr_assert(strstr(err, "config.json"), "%s", err);
    free(good);
    model_destroy(&m);
}

// The scheduler's version 0 (built on the host, no backend) is the blob of lora_new, byte for byte,
// for every target set; a different seed gives a different blob, an invalid config an error.
Test(lora, initial_blob_equals_new_adapter) {
    char err[ERR_LEN];
    hf_config_t c = tu_config();
    unsigned sets[3] = {1u << LORA_Q | 1u << LORA_V, LORA_ALL_TARGETS, 1u << LORA_DOWN | 1u << LORA_O};
    for (int i = 0; i < 3; i++) {
        peft_config_t pc = {.r = 3 + i, .alpha = 8.0f + i, .targets = sets[i]};
        lora_t *a = lora_new(&c, &pc, kernels_cpu(), 41 + i, err);
        cr_assert_not_null(a, "%s", err);
        uint8_t *want, *got, *other;
        size_t nw, ng, no;
        cr_assert_eq(lora_serialize(a, &want, &nw, err), 0, "%s", err);
        cr_assert_eq(lora_initial_serialize(&c, &pc, 41 + i, &got, &ng, err), 0, "%s", err);
        cr_assert_eq(ng, nw);
        cr_assert_eq(memcmp(got, want, nw), 0, "target set %d: the blobs differ", i);
        cr_assert_eq(lora_initial_serialize(&c, &pc, 42 + i, &other, &no, err), 0, "%s", err);
        cr_assert(no == nw && memcmp(other, want, nw) != 0, "another seed gave the same values");
        free(want), free(got), free(other);
        lora_destroy(&a);
    }
    peft_config_t bad = {.r = 0, .alpha = 8.0f, .targets = LORA_ALL_TARGETS};
    uint8_t *blob = NULL;
    size_t n = 0;
    cr_assert_eq(lora_initial_serialize(&c, &bad, 1, &blob, &n, err), -1);
    cr_assert(strstr(err, "rank"), "%s", err);
    cr_assert_null(blob);
}

Test(lora, peft_files_and_blobs_round_trip_bit_exact) {
    char dir[256], err[ERR_LEN];
    tu_tmpdir(dir, sizeof dir, "peft-rt");
    hf_config_t c = tu_config();
    lora_t *a = tu_adapter(&c, 5, 1u << LORA_Q | 1u << LORA_V | 1u << LORA_DOWN, 3);
    cr_assert_eq(lora_save(a, dir, err), 0, "%s", err);
    lora_t *b = lora_load(dir, &c, kernels_cpu(), err);
    cr_assert_not_null(b, "%s", err);
    cr_assert_eq(b->cfg.r, 5);
    cr_assert_eq(b->cfg.targets, a->cfg.targets);
    cr_assert_float_eq(b->scale, a->scale, 0);
    cr_assert_eq(memcmp(a->params, b->params, sizeof(float) * a->n_params), 0);
    uint8_t *blob;
    size_t n;
    cr_assert_eq(lora_serialize(a, &blob, &n, err), 0, "%s", err);
    lora_t *d = lora_deserialize(blob, n, &c, kernels_cpu(), err);
    cr_assert_not_null(d, "%s", err);
    cr_assert_eq(memcmp(a->params, d->params, sizeof(float) * a->n_params), 0);
    // PEFT layout on disk: lora_B is (out, r); element (o, j) equals in-memory B[j][o]
    char path[512];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    st_file_t *f = st_open(path, err);
    const st_tensor_t *tb = st_find(f, "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight");
    cr_assert_not_null(tb);
    cr_assert_eq(tb->shape[0], c.num_key_value_heads * c.head_dim);
    cr_assert_eq(tb->shape[1], 5);
    float *fb = malloc(tb->nbytes);
    cr_assert_eq(st_read_f32(f, tb->name, 2, tb->shape, fb, err), 0, "%s", err);
    int out = c.num_key_value_heads * c.head_dim;
    const float *B1 = a->B[LORA_V] + (size_t)1 * 5 * out;
    for (int o = 0; o < out; o++)
        for (int j = 0; j < 5; j++) cr_assert_eq(fb[o * 5 + j], B1[j * out + o]);
    free(fb);
    st_close(&f);
    // corrupted blob
    blob[n / 2] ^= 0xFF;
    blob[10] = '!';
    lora_t *bad = lora_deserialize(blob, n / 3, &c, kernels_cpu(), err);
    cr_assert_null(bad);
    free(blob);
    // an adapter made for another model shape
    hf_config_t c2 = c;
    c2.hidden_size = 48;
    c2.head_dim = 12;
    cr_assert_null(lora_load(dir, &c2, kernels_cpu(), err));
    cr_assert(strstr(err, "shape"), "%s", err);
    lora_destroy(&a), lora_destroy(&b), lora_destroy(&d);
}

Test(lora, pool_slot_replacement_leaves_other_slots_intact) {
    char err[ERR_LEN];
    hf_config_t c = tu_config();
    model_t *m = tu_model(&c, 2);
    lora_pool_t *pool = lora_pool_new(3);
    engine_t *e = engine_new(m, pool, err);
    for (int s = 0; s < 3; s++) {
        lora_t *a = tu_adapter(&c, 2 + s, LORA_ALL_TARGETS, 10 + s);
        cr_assert_eq(lora_pool_set(pool, s, &a, err), 0, "%s", err);
    }
    int32_t tok[6] = {1, 2, 3, 4, 5, 6};
    float before[3][41], after[3][41];
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            lora_t *a = tu_adapter(&c, 7, 1u << LORA_O, 99);
            cr_assert_eq(lora_pool_set(pool, 1, &a, err), 0, "%s", err);
        }
        for (int s = 0; s < 3; s++) {
            kvcache_t *kc = kvcache_new(2, 16, 4, 16, 2, err);
            engine_seq_t q = {.tokens = tok, .n_tokens = 6, .kv_seq = kvcache_seq_new(kc, err), .slot = s,
                              .logits = ENGINE_LOGITS_LAST};
            cr_assert_eq(engine_step(e, kc, &q, 1, pass ? after[s] : before[s], err), 0, "%s", err);
            kvcache_destroy(&kc);
        }
    }
    cr_assert_eq(memcmp(before[0], after[0], sizeof before[0]), 0);
    cr_assert_eq(memcmp(before[2], after[2], sizeof before[2]), 0);
    cr_assert_gt(tu_max_abs_diff(before[1], after[1], 41, NULL), 1e-3f);
    cr_assert_eq(lora_pool_set(pool, 3, NULL, err), -1);
    engine_destroy(&e);
    lora_pool_destroy(&pool);
    model_destroy(&m);
}
