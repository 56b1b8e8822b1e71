// test_prefix.c - shared prefixes (GRPO samples sharing their prompt): the attention kernel with
// prefix rows against the same attention with the prefix copied into every sequence, and
// engine_train / engine_logprobs with shared prefixes against the same samples unshared (losses,
// statistics, LoRA and base-model gradients); and the refusal of malformed prefixes.
#include <criterion/criterion.h>
#include <stdlib.h>

#include "testutil.h"

// Max over i of |a - b| / max(|b|, floor): a relative error that does not blow up on entries
// that are zero up to rounding.
static double rel_err(const float *a, const float *b, size_t n, double floor, size_t *where) {
    double mx = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / fmax(fabs((double)b[i]), floor);
        if (d > mx || isnan(d)) {
            mx = isnan(d) ? INFINITY : d;
            if (where) *where = i;
        }
    }
    return mx;
}

static void fill_uniform(float *x, size_t n, rng_t *r) {
    for (size_t i = 0; i < n; i++) x[i] = 2.0f * rng_uniform(r) - 1.0f;
}

// --- the attention kernel --------------------------------------------------------------------

// Sequences of the packed layout: own rows, and the prefix (a sequence index and a length;
// pre_of = -1 for none). Prefix lengths 7, 1 and 4 (a part of a longer prefix sequence), own
// lengths 1 and 5, several sequences on one prefix, some without a prefix.
typedef struct {
    int len, pre_of, pre_len;
} kseq_t;

// Attention backward of the packed layout a (no prefixes) in double, from its definition: for
// query t of sequence s, head h, P_j = softmax_j(scale q_t . k_j) over j <= t,
// dS_j = P_j (dout_t . v_j - sum_i P_i dout_t . v_i), dq_t = scale sum_j dS_j k_j,
// dk_j += scale dS_j q_t, dv_j += P_j dout_t, and the forward's out_t = sum_j P_j v_j. Largest
// |difference| from dq, dk, dv and out into err[4].
static void attn_bwd_reference(const kern_packed_attn_t *a, const float *q, const float *k, const float *v,
                               const float *dout, const float *out, const float *dq, const float *dk, const float *dv,
                               double err[4]) {
    int H = a->n_heads, KV = a->n_kv_heads, hd = a->head_dim, Qd = H * hd, KVd = KV * hd;
    double scale = 1.0 / sqrt((double)hd);
    double *rq = calloc((size_t)a->n_tokens * Qd, sizeof(double)), *rk = calloc((size_t)a->n_tokens * KVd, sizeof(double));
    double *rv = calloc((size_t)a->n_tokens * KVd, sizeof(double)), *P = malloc(sizeof(double) * (size_t)a->max_len);
    double *dP = malloc(sizeof(double) * (size_t)a->max_len);
    cr_assert_leq(hd, 128);
    err[3] = 0;
    for (int s = 0; s < a->n_seqs; s++)
        for (int h = 0; h < H; h++) {
            int kh = h / (H / KV);
            for (int t = 0; t < a->len[s]; t++) {
                size_t i = (size_t)a->start[s] + t;
                const float *qt = q + i * Qd + (size_t)h * hd, *ot = dout + i * Qd + (size_t)h * hd;
                double mx = -INFINITY, z = 0, D = 0, o[128] = {0};
                for (int j = 0; j <= t; j++) {
                    const float *kj = k + ((size_t)a->start[s] + j) * KVd + (size_t)kh * hd;
                    double sc = 0;
                    for (int d = 0; d < hd; d++) sc += (double)qt[d] * kj[d];
                    P[j] = sc * scale;
                    if (P[j] > mx) mx = P[j];
                }
                for (int j = 0; j <= t; j++) z += (P[j] = exp(P[j] - mx));
                for (int j = 0; j <= t; j++) {
                    const float *vj = v + ((size_t)a->start[s] + j) * KVd + (size_t)kh * hd;
                    P[j] /= z;
                    for (int d = 0; d < hd; d++) o[d] += P[j] * vj[d];
                    dP[j] = 0;
                    for (int d = 0; d < hd; d++) dP[j] += (double)ot[d] * vj[d];
                    D += P[j] * dP[j];
                }
                for (int d = 0; d < hd; d++) err[3] = fmax(err[3], fabs(o[d] - out[i * Qd + (size_t)h * hd + d]));
                for (int j = 0; j <= t; j++) {
                    size_t r = ((size_t)a->start[s] + j) * KVd + (size_t)kh * hd;
                    double dS = P[j] * (dP[j] - D);
                    for (int d = 0; d < hd; d++) {
                        rq[i * Qd + (size_t)h * hd + d] += scale * dS * k[r + d];
                        rk[r + d] += scale * dS * qt[d];
                        rv[r + d] += P[j] * ot[d];
                    }
                }
            }
        }
    err[0] = err[1] = err[2] = 0;
    for (size_t x = 0; x < (size_t)a->n_tokens * Qd; x++) err[0] = fmax(err[0], fabs(rq[x] - dq[x]));
    for (size_t x = 0; x < (size_t)a->n_tokens * KVd; x++) {
        err[1] = fmax(err[1], fabs(rk[x] - dk[x]));
        err[2] = fmax(err[2], fabs(rv[x] - dv[x]));
    }
    free(rq), free(rk), free(rv), free(P), free(dP);
}

static void attn_case(int H, int KV, int hd) {
    const kernels_t *k = kernels_cpu();
    enum { NS = 8 };
    // 0 and 3 are prefix sequences; 5 has no prefix and is nobody's prefix
    kseq_t sq[NS] = {{7, -1, 0}, {5, 0, 7}, {1, 0, 7}, {1, -1, 0}, {5, 3, 1}, {3, -1, 0}, {2, 0, 4}, {1, 3, 1}};
    int Qd = H * hd, KVd = KV * hd;
    // shared layout: rows of every sequence in order
    int start[NS], len[NS], pre_start[NS], pre_len[NS], N = 0, max_len = 0;
    for (int s = 0; s < NS; s++) start[s] = N, len[s] = sq[s].len, N += sq[s].len;
    for (int s = 0; s < NS; s++) {
        pre_len[s] = sq[s].pre_len;
        pre_start[s] = sq[s].pre_of >= 0 ? start[sq[s].pre_of] : 0;
        if (pre_len[s] + len[s] > max_len) max_len = pre_len[s] + len[s];
    }
    // expanded layout: every prefix copied in front of the sequence's own rows
    int xstart[NS], xlen[NS], XN = 0;
    int *xrow = malloc(sizeof(int) * (size_t)N * 4);   // shared row of each expanded row
    bool *xcopy = malloc(sizeof(bool) * (size_t)N * 4);
    for (int s = 0; s < NS; s++) {
        xstart[s] = XN;
        xlen[s] = pre_len[s] + len[s];
        for (int p = 0; p < pre_len[s]; p++, XN++) xrow[XN] = pre_start[s] + p, xcopy[XN] = true;
        for (int t = 0; t < len[s]; t++, XN++) xrow[XN] = start[s] + t, xcopy[XN] = false;
    }
    rng_t r;
    rng_seed(&r, 77 + (uint64_t)hd);
    float *q = malloc(sizeof(float) * (size_t)N * Qd), *kk = malloc(sizeof(float) * (size_t)N * KVd);
    float *v = malloc(sizeof(float) * (size_t)N * KVd), *dout = malloc(sizeof(float) * (size_t)N * Qd);
    fill_uniform(q, (size_t)N * Qd, &r);
    fill_uniform(kk, (size_t)N * KVd, &r);
    fill_uniform(v, (size_t)N * KVd, &r);
    fill_uniform(dout, (size_t)N * Qd, &r);
    float *xq = malloc(sizeof(float) * (size_t)XN * Qd), *xk = malloc(sizeof(float) * (size_t)XN * KVd);
    float *xv = malloc(sizeof(float) * (size_t)XN * KVd), *xdout = malloc(sizeof(float) * (size_t)XN * Qd);
    for (int i = 0; i < XN; i++) {
        memcpy(xq + (size_t)i * Qd, q + (size_t)xrow[i] * Qd, sizeof(float) * Qd);
        memcpy(xk + (size_t)i * KVd, kk + (size_t)xrow[i] * KVd, sizeof(float) * KVd);
        memcpy(xv + (size_t)i * KVd, v + (size_t)xrow[i] * KVd, sizeof(float) * KVd);
        // the copies' own queries do not exist in the shared layout: no gradient flows into them
        for (int d = 0; d < Qd; d++) xdout[(size_t)i * Qd + d] = xcopy[i] ? 0.0f : dout[(size_t)xrow[i] * Qd + d];
    }
    kern_packed_attn_t a = {.start = start, .len = len, .pre_start = pre_start, .pre_len = pre_len, .n_seqs = NS,
                            .n_tokens = N, .n_heads = H, .n_kv_heads = KV, .head_dim = hd, .max_len = max_len};
    kern_packed_attn_t xa = {.start = xstart, .len = xlen, .n_seqs = NS, .n_tokens = XN, .n_heads = H,
                             .n_kv_heads = KV, .head_dim = hd, .max_len = max_len};
    float *out = malloc(sizeof(float) * (size_t)N * Qd), *lse = malloc(sizeof(float) * (size_t)N * H);
    float *dq = malloc(sizeof(float) * (size_t)N * Qd), *dk = malloc(sizeof(float) * (size_t)N * KVd);
    float *dv = malloc(sizeof(float) * (size_t)N * KVd);
    float *xout = malloc(sizeof(float) * (size_t)XN * Qd), *xlse = malloc(sizeof(float) * (size_t)XN * H);
    float *xdq = malloc(sizeof(float) * (size_t)XN * Qd), *xdk = malloc(sizeof(float) * (size_t)XN * KVd);
    float *xdv = malloc(sizeof(float) * (size_t)XN * KVd);
    k->attn_fwd(out, lse, q, kk, v, &a);
    k->attn_bwd(dq, dk, dv, dout, out, lse, q, kk, v, &a);
    k->attn_fwd(xout, xlse, xq, xk, xv, &xa);
    k->attn_bwd(xdq, xdk, xdv, xdout, xout, xlse, xq, xk, xv, &xa);
    // the expanded layout against the definition in double
    double err[4];
    attn_bwd_reference(&xa, xq, xk, xv, xdout, xout, xdq, xdk, xdv, err);
    cr_assert_lt(err[3], 1e-5, "hd %d: out differs from the reference by %g", hd, err[3]);
    cr_assert_lt(err[0], 1e-5, "hd %d: dq differs from the reference by %g", hd, err[0]);
    cr_assert_lt(err[1], 1e-5, "hd %d: dk differs from the reference by %g", hd, err[1]);
    cr_assert_lt(err[2], 1e-5, "hd %d: dv differs from the reference by %g", hd, err[2]);
    // dk/dv of a shared row: the sum over the expanded rows that copy it
    float *sdk = calloc((size_t)N * KVd, sizeof(float)), *sdv = calloc((size_t)N * KVd, sizeof(float));
    for (int i = 0; i < XN; i++)
        for (int d = 0; d < KVd; d++) {
            sdk[(size_t)xrow[i] * KVd + d] += xdk[(size_t)i * KVd + d];
            sdv[(size_t)xrow[i] * KVd + d] += xdv[(size_t)i * KVd + d];
        }
    for (int i = 0; i < XN; i++) {
        if (xcopy[i]) continue;
        size_t o = (size_t)xrow[i];
        for (int d = 0; d < Qd; d++) {
            cr_assert_float_eq(out[o * Qd + d], xout[(size_t)i * Qd + d], 1e-5, "hd %d: out row %zu", hd, o);
            cr_assert_float_eq(dq[o * Qd + d], xdq[(size_t)i * Qd + d], 1e-5, "hd %d: dq row %zu", hd, o);
        }
        for (int h = 0; h < H; h++)
            cr_assert_float_eq(lse[o * H + h], xlse[(size_t)i * H + h], 1e-5, "hd %d: lse row %zu", hd, o);
    }
    size_t w = 0;
    float e1 = tu_max_abs_diff(dk, sdk, (size_t)N * KVd, &w);
    cr_assert_lt(e1, 1e-5f, "hd %d: dk differs by %g at row %zu", hd, e1, w / KVd);
    float e2 = tu_max_abs_diff(dv, sdv, (size_t)N * KVd, &w);
    cr_assert_lt(e2, 1e-5f, "hd %d: dv differs by %g at row %zu", hd, e2, w / KVd);
    // the prefix rows did receive gradient from the sequences sharing them
    double pk = 0;
    for (int d = 0; d < KVd; d++) pk += fabs(dk[(size_t)start[0] * KVd + d]);
    cr_assert_gt(pk, 0.0);
    free(xrow), free(xcopy), free(q), free(kk), free(v), free(dout), free(xq), free(xk), free(xv), free(xdout);
    free(out), free(lse), free(dq), free(dk), free(dv), free(xout), free(xlse), free(xdq), free(xdk), free(xdv);
    free(sdk), free(sdv);
}

// (heads, KV heads, head size): head sizes below, at and past a whole vector of the dot products'
// partial sums (16 lanes with AVX-512, 8 with AVX2, 4 with SSE2), with and without elements after
// the last whole one
static const int ATTN_SHAPES[][3] = {{4, 2, 8}, {3, 1, 5}, {2, 2, 16}, {4, 2, 20}, {4, 2, 32}, {2, 1, 37}, {4, 1, 64}};
#define N_ATTN_SHAPES (int)(sizeof ATTN_SHAPES / sizeof ATTN_SHAPES[0])

Test(prefix, attn_kernel_matches_expanded_prefixes) {
    for (int i = 0; i < N_ATTN_SHAPES; i++) attn_case(ATTN_SHAPES[i][0], ATTN_SHAPES[i][1], ATTN_SHAPES[i][2]);
}

// --- engine_train / engine_logprobs ----------------------------------------------------------

enum { SLOTS = 2, GROUPS = 2, G = 4, MAXLEN = 24 };
enum { NG = SLOTS * GROUPS, NSAMP = NG * G };

// A batch: per slot GROUPS prompts of different lengths, G samples each with completions of
// different lengths, plus one base-model sequence without a prefix.
typedef struct {
    int32_t tok[NSAMP + 1][MAXLEN];
    float w[NSAMP + 1][MAXLEN], old[NSAMP + 1][MAXLEN], ref[NSAMP + 1][MAXLEN];
    int len[NSAMP + 1], prompt[NSAMP + 1], slot[NSAMP + 1], group[NSAMP + 1];
    float adv[NSAMP + 1];
    bool on_policy[NSAMP + 1];
} batch_t;

static const int PROMPT_LEN[NG] = {6, 2, 9, 4};   // prefix lengths 5, 1, 8, 3

static void make_batch(batch_t *b, int V) {
    rng_t r;
    rng_seed(&r, 4242);
    memset(b, 0, sizeof *b);
    int32_t prompts[NG][MAXLEN];
    for (int g = 0; g < NG; g++)
        for (int t = 0; t < PROMPT_LEN[g]; t++) prompts[g][t] = (int32_t)(rng_next(&r) % (uint64_t)V);
    for (int i = 0; i <= NSAMP; i++) {
        // groups alternate between the slots: 1, 0, 1, 0
        int g = i < NSAMP ? i / G : -1;
        b->group[i] = g;
        b->slot[i] = g < 0 ? -1 : 1 - g % 2;
        b->prompt[i] = g < 0 ? 3 : PROMPT_LEN[g];
        int comp = 1 + (int)(rng_next(&r) % 7);
        b->len[i] = b->prompt[i] + comp;
        for (int t = 0; t < b->len[i]; t++) {
            b->tok[i][t] = g >= 0 && t < b->prompt[i] ? prompts[g][t] : (int32_t)(rng_next(&r) % (uint64_t)V);
            b->w[i][t] = t >= b->prompt[i] ? 0.5f + rng_uniform(&r) : 0.0f;
        }
        b->adv[i] = 2.0f * rng_uniform(&r) - 1.0f;
        b->on_policy[i] = i % 3 == 0;
    }
}

// The batch as engine sequences: unshared (NSAMP + 1 sequences), or shared (one prefix sequence
// per group in front of its samples: NG + NSAMP + 1). map[i] = index of sample i in seqs.
static int batch_seqs(batch_t *b, bool shared, engine_train_seq_t *seqs, int *map) {
    int n = 0;
    for (int i = 0; i <= NSAMP; i++) {
        int g = b->group[i], prefix_of = 0, prefix_len = 0;
        if (shared && g >= 0) {
            if (i % G == 0) {
                // the prefix sequence: the prompt less its last token, no loss
                seqs[n] = (engine_train_seq_t){.tokens = b->tok[i], .len = b->prompt[i] - 1, .slot = b->slot[i]};
                n++;
            }
            prefix_of = n - (i % G);   // index of the prefix sequence + 1
            prefix_len = b->prompt[i] - 1;
        }
        map[i] = n;
        seqs[n++] = (engine_train_seq_t){.tokens = b->tok[i], .len = b->len[i], .slot = b->slot[i],
                                         .weight = b->w[i], .old_logp = b->old[i], .ref_logp = b->ref[i],
                                         .advantage = b->adv[i], .on_policy = b->on_policy[i],
                                         .prefix_of = prefix_of, .prefix_len = prefix_len};
    }
    return n;
}

typedef struct {
    hf_config_t c;
    model_t *m;
    lora_pool_t *pool;
    engine_t *e;
} pfx_t;

static pfx_t pfx_new(void) {
    pfx_t f;
    char err[ERR_LEN];
    f.c = tu_config();
    f.m = tu_model(&f.c, 31);
    f.pool = lora_pool_new(SLOTS);
    int ranks[SLOTS] = {2, 5};
    for (int s = 0; s < SLOTS; s++) {
        lora_t *a = tu_adapter(&f.c, ranks[s], LORA_ALL_TARGETS, 50 + (uint64_t)s);
        cr_assert_eq(lora_pool_set(f.pool, s, &a, err), 0, "%s", err);
    }
    f.e = engine_new(f.m, f.pool, err);
    cr_assert_not_null(f.e, "%s", err);
    return f;
}

static void pfx_free(pfx_t *f) {
    engine_destroy(&f->e);
    lora_pool_destroy(&f->pool);
    model_destroy(&f->m);
}

static void check_grads(const char *what, const float *shared, const float *plain, size_t n) {
    size_t w = 0;
    double e = rel_err(shared, plain, n, 1e-2, &w);
    cr_assert_lt(e, 1e-4, "%s: relative error %g at %zu (shared %.9g, unshared %.9g)", what, e, w, shared[w], plain[w]);
    double ss = 0;
    for (size_t i = 0; i < n; i++) ss += (double)plain[i] * plain[i];
    cr_assert_gt(ss, 0.0, "%s: gradient vanished, nothing compared", what);
}

static void stat_eq(const char *what, int g, double a, double b) {
    cr_assert(fabs(a - b) <= 1e-5 * fmax(1.0, fabs(b)), "group %d %s: shared %.9g unshared %.9g", g, what, a, b);
}

// logprobs of the batch, shared or not, with the given slot override (-2 = the batch's own)
static void batch_logprobs(pfx_t *f, batch_t *b, bool shared, int slot, float T, float (*lp)[MAXLEN]) {
    char err[ERR_LEN];
    engine_train_seq_t seqs[NG + NSAMP + 1];
    int map[NSAMP + 1];
    int n = batch_seqs(b, shared, seqs, map);
    if (slot != -2)
        for (int i = 0; i < n; i++) seqs[i].slot = slot;
    float scratch[NG][MAXLEN];
    float *out[NG + NSAMP + 1];
    for (int i = 0, p = 0; i < n; i++) out[i] = scratch[p++ % NG];
    for (int i = 0; i <= NSAMP; i++) out[map[i]] = lp[i];
    cr_assert_eq(engine_logprobs(f->e, seqs, n, T, out, NULL, err), 0, "%s", err);
}

static void equivalence(float kl_coef, bool base_grads) {
    pfx_t f = pfx_new();
    static batch_t b;
    make_batch(&b, f.c.vocab_size);
    float T = 0.8f;
    // behaviour and reference log-probs around the current ones: some ratios clipped, some not
    static float cur[NSAMP + 1][MAXLEN];
    batch_logprobs(&f, &b, false, -2, T, cur);
    rng_t r;
    rng_seed(&r, 5);
    for (int i = 0; i <= NSAMP; i++)
        for (int t = 0; t < b.len[i]; t++) {
            b.old[i][t] = cur[i][t] + 0.4f * (2.0f * rng_uniform(&r) - 1.0f);
            b.ref[i][t] = cur[i][t] + 0.3f * (2.0f * rng_uniform(&r) - 1.0f);
        }
    // reference log-probs of the base model through the prefix path equal the unshared ones
    static float base_plain[NSAMP + 1][MAXLEN], base_shared[NSAMP + 1][MAXLEN], cur_shared[NSAMP + 1][MAXLEN];
    batch_logprobs(&f, &b, false, -1, T, base_plain);
    batch_logprobs(&f, &b, true, -1, T, base_shared);
    batch_logprobs(&f, &b, true, -2, T, cur_shared);
    for (int i = 0; i <= NSAMP; i++) {
        int p0 = b.group[i] >= 0 ? b.prompt[i] - 1 : 0;
        for (int t = 0; t < b.len[i]; t++) {
            if (t <= p0) {
                cr_assert_eq(cur_shared[i][t], 0.0f, "sample %d t %d: not filled with 0", i, t);
                continue;
            }
            cr_assert_float_eq(cur_shared[i][t], cur[i][t], 1e-5, "sample %d t %d", i, t);
            cr_assert_float_eq(base_shared[i][t], base_plain[i][t], 1e-5, "base, sample %d t %d", i, t);
        }
    }

    loss_cfg_t lc = {.kind = LOSS_RL, .temperature = T, .clip_low = 0.2f, .clip_high = 0.28f, .kl_coef = kl_coef};
    float *lg[2][SLOTS], *mg[2] = {NULL, NULL};
    loss_stats_t st[2][SLOTS + 1];
    for (int sh = 0; sh < 2; sh++) {
        char err[ERR_LEN];
        for (int s = 0; s < SLOTS; s++) lg[sh][s] = calloc(lora_pool_get(f.pool, s)->n_params, sizeof(float));
        if (base_grads) mg[sh] = calloc(f.m->n_params, sizeof(float));
        engine_train_seq_t seqs[NG + NSAMP + 1];
        int map[NSAMP + 1];
        int n = batch_seqs(&b, sh == 1, seqs, map);
        cr_assert_eq(n, sh ? NG + NSAMP + 1 : NSAMP + 1);
        cr_assert_eq(engine_train(f.e, seqs, n, &lc, mg[sh], lg[sh], st[sh], SLOTS + 1, err), 0, "%s", err);
    }
    for (int g = 0; g <= SLOTS; g++) {
        const loss_stats_t *a = &st[1][g], *p = &st[0][g];
        cr_assert_gt(p->tokens, 0.0);
        stat_eq("loss", g, a->loss, p->loss);
        stat_eq("tokens", g, a->tokens, p->tokens);
        stat_eq("clip_frac", g, a->clip_frac, p->clip_frac);
        stat_eq("kl", g, a->kl, p->kl);
        stat_eq("entropy", g, a->entropy, p->entropy);
        stat_eq("ratio_mean", g, a->ratio_mean, p->ratio_mean);
        stat_eq("logp_mean", g, a->logp_mean, p->logp_mean);
        stat_eq("mismatch", g, a->mismatch, p->mismatch);
        stat_eq("mismatch_tokens", g, a->mismatch_tokens, p->mismatch_tokens);
    }
    // the case exercises both branches of the clipped objective
    cr_assert_gt(st[0][1].clip_frac + st[0][2].clip_frac, 0.0);
    cr_assert_lt(st[0][1].clip_frac, 1.0);
    for (int s = 0; s < SLOTS; s++) {
        char what[64];
        snprintf(what, sizeof what, "slot %d LoRA", s);
        check_grads(what, lg[1][s], lg[0][s], lora_pool_get(f.pool, s)->n_params);
    }
    if (base_grads) {
        size_t sizes[MODEL_N_TENSORS], off = 0;
        model_param_sizes(&f.c, sizes);
        for (int i = 0; i < MODEL_N_TENSORS; i++) {
            char what[64];
            snprintf(what, sizeof what, "base tensor %d", i);
            if (sizes[i]) check_grads(what, mg[1] + off, mg[0] + off, sizes[i]);
            off += sizes[i];
        }
    }
    for (int sh = 0; sh < 2; sh++) {
        for (int s = 0; s < SLOTS; s++) free(lg[sh][s]);
        free(mg[sh]);
    }
    pfx_free(&f);
}

Test(prefix, train_equals_unshared) { equivalence(0.0f, false); }

Test(prefix, train_equals_unshared_with_kl_and_base_grads) { equivalence(0.1f, true); }

// --- bad input ----------------------------------------------------------------------------------

Test(prefix, malformed_prefixes_refused) {
    pfx_t f = pfx_new();
    static batch_t b;
    make_batch(&b, f.c.vocab_size);
    engine_train_seq_t good[NG + NSAMP + 1];
    int map[NSAMP + 1];
    int n = batch_seqs(&b, true, good, map);
    // sequences: 0 = prefix of group 0 (slot 1), 1..4 its samples, 5 = prefix of group 1 (slot 0)
    int32_t other[MAXLEN];
    memcpy(other, b.tok[0], sizeof other);
    other[2] = (other[2] + 1) % f.c.vocab_size;
    float wbad[MAXLEN];
    memcpy(wbad, b.w[0], sizeof wbad);
    wbad[PROMPT_LEN[0] - 1] = 1.0f;   // t = prefix_len
    struct {
        const char *rule;
        int seq;
        engine_train_seq_t bad;
    } cases[] = {
        {"must name an earlier sequence", 2, good[2]},
        {"must name an earlier sequence", 2, good[2]},
        {"must name an earlier sequence", 2, good[2]},
        {"one level only", 5, good[5]},
        {"differs from the slot", 2, good[2]},
        {"must be in 1..len-1", 2, good[2]},
        {"must be in 1..len-1", 2, good[2]},
        {"exceeds the length", 2, good[2]},
        {"token 2 differs from its prefix sequence", 2, good[2]},
        {"must be 0 within the shared prefix", 2, good[2]},
        {"without a prefix sequence", 2, good[2]},
    };
    cases[0].bad.prefix_of = 3;    // itself
    cases[1].bad.prefix_of = 4;    // a later sequence
    cases[2].bad.prefix_of = -1;
    cases[3].bad.prefix_of = 2, cases[3].bad.prefix_len = 1;   // sequence 1 has a prefix itself
    cases[4].bad.slot = 0;
    cases[5].bad.prefix_len = 0;
    cases[6].bad.prefix_len = good[2].len;
    cases[7].bad.prefix_len = good[0].len + 1;
    cases[8].bad.tokens = other;
    cases[9].bad.weight = wbad;
    cases[10].bad.prefix_of = 0;
    loss_cfg_t lc = {.kind = LOSS_RL, .temperature = 1.0f, .clip_low = 0.2f, .clip_high = 0.28f};
    float *lg[SLOTS];
    size_t np[SLOTS];
    for (int s = 0; s < SLOTS; s++) {
        np[s] = lora_pool_get(f.pool, s)->n_params;
        lg[s] = malloc(sizeof(float) * np[s]);
        for (size_t i = 0; i < np[s]; i++) lg[s][i] = 0.25f;
    }
    float *mg = malloc(sizeof(float) * f.m->n_params);
    for (size_t i = 0; i < f.m->n_params; i++) mg[i] = 0.25f;
    float lpbuf[NG + NSAMP + 1][MAXLEN], *lp[NG + NSAMP + 1];
    for (int i = 0; i < n; i++) lp[i] = lpbuf[i];
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        engine_train_seq_t seqs[NG + NSAMP + 1];
        memcpy(seqs, good, sizeof(engine_train_seq_t) * (size_t)n);
        seqs[cases[c].seq] = cases[c].bad;
        char err[ERR_LEN] = "";
        cr_assert_eq(engine_train(f.e, seqs, n, &lc, mg, lg, NULL, 0, err), -1, "case %zu (%s) accepted", c,
                     cases[c].rule);
        cr_assert_not_null(strstr(err, cases[c].rule), "case %zu: error '%s' does not name '%s'", c, err,
                           cases[c].rule);
        err[0] = 0;
        cr_assert_eq(engine_logprobs(f.e, seqs, n, 1.0f, lp, NULL, err), -1, "case %zu: logprobs accepted", c);
        cr_assert_not_null(strstr(err, cases[c].rule), "case %zu: logprobs error '%s'", c, err);
    }
    for (int s = 0; s < SLOTS; s++)
        for (size_t i = 0; i < np[s]; i++) cr_assert_eq(lg[s][i], 0.25f, "slot %d gradient touched", s);
    for (size_t i = 0; i < f.m->n_params; i++) cr_assert_eq(mg[i], 0.25f, "base gradient touched");
    // the unmodified batch is accepted
    char err[ERR_LEN];
    cr_assert_eq(engine_train(f.e, good, n, &lc, mg, lg, NULL, 0, err), 0, "%s", err);
    for (int s = 0; s < SLOTS; s++) free(lg[s]);
    free(mg);
    pfx_free(&f);
}

// The decode path (paged K/V, block tables: a dot product per key) and the training path (packed
// rows: the CPU backend's scores from a transposed panel of the keys) compute each output row from
// the same sums in the same order: equal bits, for head sizes of one vector of dot()'s partial sums
// and less and more, with and without elements after the last whole vector.
// Equal bits hold in the optimised build without sanitizers; -O0 and the sanitizers'
// instrumentation compile dot() differently (testfp.h), and there the two paths agree to rounding.
#if defined(__OPTIMIZE__) && !defined(__SANITIZE_ADDRESS__)
#define ATTN_EXACT 1
#else
#define ATTN_EXACT 0
#endif
static void paged_case(int H, int KV, int hd) {
    const kernels_t *k = kernels_cpu();
    enum { L = 21, BS = 4, NB = (L + BS - 1) / BS };
    int Qd = H * hd, KVd = KV * hd;
    rng_t r;
    rng_seed(&r, 991 + (uint64_t)hd);
    float *q = malloc(sizeof(float) * L * Qd), *kk = malloc(sizeof(float) * L * KVd);
    float *v = malloc(sizeof(float) * L * KVd);
    fill_uniform(q, (size_t)L * Qd, &r);
    fill_uniform(kk, (size_t)L * KVd, &r);
    fill_uniform(v, (size_t)L * KVd, &r);
    // the pool: blocks in reverse order, one spare block first
    int table[NB];
    float *kp = calloc((size_t)(NB + 1) * BS * KVd, sizeof(float));
    float *vp = calloc((size_t)(NB + 1) * BS * KVd, sizeof(float));
    for (int b = 0; b < NB; b++) table[b] = NB - b;
    for (int p = 0; p < L; p++) {
        size_t off = (size_t)table[p / BS] * BS * KVd + (size_t)(p % BS) * KVd;
        memcpy(kp + off, kk + (size_t)p * KVd, sizeof(float) * KVd);
        memcpy(vp + off, v + (size_t)p * KVd, sizeof(float) * KVd);
    }
    const int *tables[1] = {table};
    int seq_of[L];
    int32_t pos[L];
    for (int i = 0; i < L; i++) seq_of[i] = 0, pos[i] = i;
    kern_paged_attn_t pa = {.k_base = kp, .v_base = vp, .block_stride = (size_t)BS * KVd, .block_size = BS,
                            .tables = tables, .seq_of = seq_of, .pos = pos, .n_tokens = L, .n_heads = H,
                            .n_kv_heads = KV, .head_dim = hd, .max_ctx = L};
    int start[1] = {0}, len[1] = {L};
    kern_packed_attn_t a = {.start = start, .len = len, .n_seqs = 1, .n_tokens = L, .n_heads = H, .n_kv_heads = KV,
                            .head_dim = hd, .max_len = L};
    float *o1 = malloc(sizeof(float) * L * Qd), *o2 = malloc(sizeof(float) * L * Qd);
    float *lse = malloc(sizeof(float) * L * H);
    k->attn_paged(o1, q, &pa);
    k->attn_fwd(o2, lse, q, kk, v, &a);
    for (int i = 0; i < L * Qd; i++)
        cr_assert(ATTN_EXACT ? o1[i] == o2[i] : fabsf(o1[i] - o2[i]) <= 1e-6f * fmaxf(1.0f, fabsf(o2[i])),
                  "hd %d: element %d: paged %.9g, packed %.9g", hd, i, o1[i], o2[i]);
    free(q), free(kk), free(v), free(kp), free(vp), free(o1), free(o2), free(lse);
}

Test(prefix, paged_attention_matches_packed_bits) {
    for (int i = 0; i < N_ATTN_SHAPES; i++) paged_case(ATTN_SHAPES[i][0], ATTN_SHAPES[i][1], ATTN_SHAPES[i][2]);
}
