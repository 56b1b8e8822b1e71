// peft_archive.c - a stored adapter blob as a PEFT adapter in one tar archive (libarchive).
#include <archive.h>
#include <archive_entry.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "peft.h"

// Writes one regular file into the archive; 0 or -1 with err.
static int add_file(struct archive *ar, const char *dir, const char *name, const void *data, size_t len, time_t now,
                    char *err) {
    char path[512];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path)
        return err_set(err, "archive path '%.64s...' too long", dir);
    struct archive_entry *e = archive_entry_new();
    if (!e) return err_set(err, "out of memory");
    archive_entry_set_pathname(e, path);
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, 0644);
    archive_entry_set_size(e, (la_int64_t)len);
    archive_entry_set_mtime(e, now, 0);
    int rc = 0;
    if (archive_write_header(ar, e) != ARCHIVE_OK || archive_write_data(ar, data, len) != (la_ssize_t)len)
        rc = err_set(err, "tar: %s", archive_error_string(ar) ?: "write failed");
    archive_entry_free(e);
    return rc;
}

// The blob's tensors in lora_save's form: the same names, shapes and order, metadata format=pt.
static int safetensors_file(const void *blob, size_t len, peft_config_t *cfg, uint8_t **out, size_t *out_len,
                            char *err) {
    char e2[ERR_LEN];
    st_file_t *f = st_open_buffer(blob, len, e2);
    if (!f) return err_set(err, "adapter blob: %s", e2);
    int rc = -1, n = st_count(f);
    float *vals = NULL;
    st_writer_t *w = NULL;
    if (peft_blob_config(f, cfg, err)) goto done;
    if (st_metadata(f, "marlaas_modelled")) {
        err_set(err, "the adapter of a simulated job (--backend sim:DEVICE) has no weights to download");
        goto done;
    }
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        const st_tensor_t *t = st_tensor(f, i);
        if (t->dtype != ST_F32 || strncmp(t->name, "base_model.model.", strlen("base_model.model.")) != 0) {
            err_set(err, "adapter blob: tensor '%.80s' is not an fp32 PEFT tensor", t->name);
            goto done;
        }
        total += t->nbytes / sizeof(float);
    }
    if (n == 0) {
        err_set(err, "adapter blob: no tensors");
        goto done;
    }
    vals = xmalloc(total ? total * sizeof(float) : 1);
    w = st_writer_new();
    st_writer_metadata(w, "format", "pt");
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        const st_tensor_t *t = st_tensor(f, i);
        if (st_read_f32(f, t->name, t->ndim, t->shape, vals + at, e2)) {
            err_set(err, "adapter blob: %s", e2);
            goto done;
        }
        st_writer_add_f32(w, t->name, t->ndim, t->shape, vals + at);
        at += t->nbytes / sizeof(float);
    }
    rc = st_writer_serialize(w, out, out_len, err);
done:
    st_writer_destroy(&w);
    free(vals);
    st_close(&f);
    return rc;
}

int peft_archive_tar(const void *blob, size_t len, const char *base_model, const char *dir, uint8_t **out,
                     size_t *out_len, char *err) {
    *out = NULL;
    *out_len = 0;
    peft_config_t cfg;
    uint8_t *st = NULL;
    size_t st_len = 0;
    if (!dir || !dir[0] || strchr(dir, '/') || !strcmp(dir, ".") || !strcmp(dir, ".."))
        return err_set(err, "archive folder '%.64s' must be one plain name", dir ? dir : "");
    if (safetensors_file(blob, len, &cfg, &st, &st_len, err)) return -1;
    if (base_model && strlen(base_model) >= sizeof cfg.base_model) {
        free(st);
        return err_set(err, "base model name longer than %zu bytes", sizeof cfg.base_model - 1);
    }
    snprintf(cfg.base_model, sizeof cfg.base_model, "%s", base_model ? base_model : "");
    char e2[ERR_LEN];
    char *json = peft_config_json(&cfg, e2);
    if (!json) {
        free(st);
        return err_set(err, "adapter blob: %s", e2);
    }
    // the archive is the two files plus headers and padding: a buffer that size suffices
    size_t cap = st_len + strlen(json) + 16 * 1024, used = 0;
    uint8_t *buf = xmalloc(cap);
    struct archive *ar = archive_write_new();
    int rc = -1;
    if (!ar) {
        err_set(err, "out of memory");
        goto done;
    }
    if (archive_write_set_format_ustar(ar) != ARCHIVE_OK || archive_write_add_filter_none(ar) != ARCHIVE_OK ||
        archive_write_set_bytes_in_last_block(ar, 1) != ARCHIVE_OK ||
        archive_write_open_memory(ar, buf, cap, &used) != ARCHIVE_OK) {
        err_set(err, "tar: %s", archive_error_string(ar) ?: "cannot start the archive");
        goto done;
    }
    time_t now = time(NULL);
    if (add_file(ar, dir, "adapter_config.json", json, strlen(json), now, err) ||
        add_file(ar, dir, "adapter_model.safetensors", st, st_len, now, err))
        goto done;
    if (archive_write_close(ar) != ARCHIVE_OK) {
        err_set(err, "tar: %s", archive_error_string(ar) ?: "cannot finish the archive");
        goto done;
    }
    *out = buf;
    *out_len = used;
    buf = NULL;
    rc = 0;
done:
    if (ar) archive_write_free(ar);
    free(buf);
    free(json);
    free(st);
    return rc;
}
