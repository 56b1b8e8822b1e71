// test_model.c - model and adapter files: bit-exact round trips (HF safetensors, PEFT files,
// Redis blobs), F16/BF16 checkpoints, and clear errors for damaged model folders.
#include <archive.h>
#include <archive_entry.h>
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

// The body of the member `name` in a tar archive (caller frees), NULL when absent; *n its size.
static char *tar_member(const uint8_t *tar, size_t len, const char *name, size_t *n, int *members) {
    struct archive *ar = archive_read_new();
    archive_read_support_format_tar(ar);
    cr_assert_eq(archive_read_open_memory(ar, tar, len), ARCHIVE_OK, "%s", archive_error_string(ar));
    struct archive_entry *e;
    char *body = NULL;
    *members = 0;
    while (archive_read_next_header(ar, &e) == ARCHIVE_OK) {
        ++*members;
        if (strcmp(archive_entry_pathname(e), name) != 0) continue;
        cr_assert_eq(archive_entry_filetype(e), AE_IFREG);
        *n = (size_t)archive_entry_size(e);
        body = malloc(*n + 1);
        cr_assert_eq(archive_read_data(ar, body, *n), (la_ssize_t)*n);
    }
    archive_read_free(ar);
    return body;
}

static void assert_same_as_file(const char *body, size_t n, const char *dir, const char *name) {
    char path[512], err[ERR_LEN];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    size_t fn;
    char *want = util_read_file(path, &fn, err);
    cr_assert_not_null(want, "%s", err);
    cr_assert_not_null(body, "%s missing from the archive", name);
    cr_assert(fn == n && memcmp(want, body, n) == 0, "%s in the archive differs from lora_save's", name);
    free(want);
}

// The console's download: the stored blob as a tar holding the two files lora_save writes, byte
// for byte; a blob that is no adapter, or an unsafe folder name, is refused with its reason.
Test(lora, peft_archive_holds_the_files_lora_save_writes) {
    char dir[256], err[ERR_LEN];
    tu_tmpdir(dir, sizeof dir, "peft-tar");
    hf_config_t c = tu_config();
    lora_t *a = tu_adapter(&c, 4, 1u << LORA_K | 1u << LORA_UP, 9);
    snprintf(a->cfg.base_model, sizeof a->cfg.base_model, "Qwen/Qwen2.5-0.5B");
    cr_assert_eq(lora_save(a, dir, err), 0, "%s", err);
    uint8_t *blob, *tar;
    size_t n, tn, bn;
    int members;
    cr_assert_eq(lora_serialize(a, &blob, &n, err), 0, "%s", err);
    cr_assert_eq(peft_archive_tar(blob, n, "Qwen/Qwen2.5-0.5B", "j-7-v3", &tar, &tn, err), 0, "%s", err);
    cr_assert_eq(tn % 512, 0, "a tar is whole 512-byte blocks");
    char *body = tar_member(tar, tn, "j-7-v3/adapter_config.json", &bn, &members);
    cr_assert_eq(members, 2);
    assert_same_as_file(body, bn, dir, "adapter_config.json");
    free(body);
    body = tar_member(tar, tn, "j-7-v3/adapter_model.safetensors", &bn, &members);
    assert_same_as_file(body, bn, dir, "adapter_model.safetensors");
    free(body);
    free(tar);
    // no base model: null in the config, as lora_save writes it
    cr_assert_eq(peft_archive_tar(blob, n, NULL, "x", &tar, &tn, err), 0, "%s", err);
    body = tar_member(tar, tn, "x/adapter_config.json", &bn, &members);
    cr_assert(body && strstr(body, "\"base_model_name_or_path\":\tnull"), "%s", body ? body : "(none)");
    free(body);
    free(tar);
    // refusals
    const char *bad_dirs[] = {"", "a/b", "..", "."};
    for (size_t i = 0; i < sizeof bad_dirs / sizeof *bad_dirs; i++) {
        cr_assert_eq(peft_archive_tar(blob, n, NULL, bad_dirs[i], &tar, &tn, err), -1, "folder '%s'", bad_dirs[i]);
        cr_assert(strstr(err, "one plain name"), "%s", err);
        cr_assert_null(tar);
    }
    char longname[300];
    memset(longname, 'm', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    cr_assert_eq(peft_archive_tar(blob, n, longname, "x", &tar, &tn, err), -1);
    cr_assert(strstr(err, "base model name longer"), "%s", err);
    cr_assert_eq(peft_archive_tar(blob, n / 2, NULL, "x", &tar, &tn, err), -1);
    cr_assert(strstr(err, "adapter blob"), "%s", err);
    free(blob);
    // blobs whose metadata or tensors are no adapter's
    float v[4] = {1, 2, 3, 4};
    int64_t shape[1] = {4};
    struct {
        const char *r, *alpha, *targets, *tensor, *want;
    } cases[] = {
        {"4", "8", "3", "base_model.model.x.lora_A.weight", NULL},
        {NULL, "8", "3", "base_model.model.x.lora_A.weight", "metadata lora_r"},
        {"0", "8", "3", "base_model.model.x.lora_A.weight", "lora_r '0'"},
        {"4x", "8", "3", "base_model.model.x.lora_A.weight", "lora_r '4x'"},
        {"4", "nan", "3", "base_model.model.x.lora_A.weight", "lora_alpha 'nan'"},
        {"4", "8", "4096", "base_model.model.x.lora_A.weight", "lora_targets '4096'"},
        {"4", "8", "0", "base_model.model.x.lora_A.weight", "lora_targets '0'"},
        {"4", "8", "3", "model.embed_tokens.weight", "not an fp32 PEFT tensor"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        st_writer_t *w = st_writer_new();
        if (cases[i].r) st_writer_metadata(w, "lora_r", cases[i].r);
        st_writer_metadata(w, "lora_alpha", cases[i].alpha);
        st_writer_metadata(w, "lora_targets", cases[i].targets);
        st_writer_add_f32(w, cases[i].tensor, 1, shape, v);
        cr_assert_eq(st_writer_serialize(w, &blob, &n, err), 0, "%s", err);
        st_writer_destroy(&w);
        int rc = peft_archive_tar(blob, n, NULL, "x", &tar, &tn, err);
        if (!cases[i].want) {
            cr_assert_eq(rc, 0, "case %zu: %s", i, err);
            free(tar);
        } else {
            cr_assert_eq(rc, -1, "case %zu accepted", i);
            cr_assert(strstr(err, cases[i].want), "case %zu: %s", i, err);
            if (cases[i].tensor[0] == 'b') {   // the engine reads the same metadata the same way
                cr_assert_null(lora_deserialize(blob, n, &c, kernels_cpu(), err));
                cr_assert(strstr(err, cases[i].want), "case %zu (lora_deserialize): %s", i, err);
            }
        }
        free(blob);
    }
    lora_destroy(&a);
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
