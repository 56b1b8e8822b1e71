// test_train_local.c - `marlaas train-local` (cli/cmd_train_local.c, compiled into this test) on
// models/micro: a few GRPO steps on a fixed seed, without and with the KL term. The adapter it
// writes and its per-step statistics are fingerprinted (testfp.h): the local loop must compute
// them bit for bit as recorded.
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/unit/testfp.h"
#include "tests/unit/testutil.h"

// The command is not part of the library: the test compiles it in, with the CLI's helpers.
#include "cli/util.c"
#include "cli/cmd_train_local.c"

// Runs train-local with args (after the model, the output folder and the metrics file), then
// adds the adapter's tensors and the metrics lines (without their wall-clock seconds) to f.
static void run_local(tfp_t *f, const char *name, const char *const *args, int n_args) {
    char dir[256], out[300], met[300], path[400];
    tu_tmpdir(dir, sizeof dir, name);
    snprintf(out, sizeof out, "%s/adapter", dir);
    snprintf(met, sizeof met, "%s/metrics.jsonl", dir);
    char *argv[40];
    int argc = 0;
    const char *fixed[] = {"train-local", "--model", "models/micro", "--out", out, "--metrics", met, "--eval-n", "0"};
    for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++) argv[argc++] = (char *)fixed[i];
    for (int i = 0; i < n_args; i++) argv[argc++] = (char *)args[i];
    argv[argc] = NULL;
    cr_assert_eq(cmd_train_local(argc, argv), 0, "%s: train-local failed (its message is above)", name);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", out);
    cr_assert_eq(tfp_file(f, path), 0, "%s: no adapter at %s", name, path);
    FILE *m = fopen(met, "r");
    cr_assert_not_null(m, "%s: no metrics at %s", name, met);
    char line[1024];
    int steps = 0;
    while (fgets(line, sizeof line, m)) {
        char *sec = strstr(line, ",\"seconds\":");
        if (sec) *sec = 0;
        tfp_str(f, line);
        steps++;
    }
    fclose(m);
    cr_assert_eq(steps, 3, "%s: %d metrics lines", name, steps);
    unlink(path);
    snprintf(path, sizeof path, "%s/adapter_config.json", out);
    unlink(path);
    rmdir(out);
    unlink(met);
    rmdir(dir);
}

Test(train_local, step_fingerprint, .timeout = 120) {
    tfp_pin_threads();
    // Recorded again when the decode steps' products (a few rows of X against each weight matrix)
    // moved from OpenBLAS's sgemv/sgemm to the CPU backend's GEMV kernels (kernels/cpu/cpu.c): the
    // rollouts' logits differ in their last bits, and so the samples and what is trained on them.
    static const tfp_recorded_t plain[] = {
        {"gcc12/avx512f/SkylakeX", 0x5d57987e9df8862cull},
        {"gcc12/avx512f/SkylakeX/san", 0x6b7f198523c3f6a1ull},
    };
    static const tfp_recorded_t kl[] = {
        {"gcc12/avx512f/SkylakeX", 0xb1a84371f3d35ccbull},
        {"gcc12/avx512f/SkylakeX/san", 0x5dc63dc91aae518aull},
    };
    tfp_t a, b;
    tfp_init(&a);
    tfp_init(&b);
    const char *pa[] = {"--task", "vowels", "--steps", "3", "--group", "4", "--prompts", "4", "--max-new", "8",
                        "--seed", "3", "--lr", "0.01"};
    run_local(&a, "local-plain", pa, (int)(sizeof pa / sizeof *pa));
    // KL to the base model: the reference pass; no std normalisation; a group may carry no signal
    const char *pb[] = {"--task", "count", "--steps", "3", "--group", "3", "--prompts", "3", "--max-new", "6",
                        "--seed", "5", "--kl", "0.05", "--no-std", "--temperature", "0.9", "--rank", "4"};
    run_local(&b, "local-kl", pb, (int)(sizeof pb / sizeof *pb));
    tfp_expect("train-local steps", a.h, plain);
    tfp_expect("train-local steps with KL", b.h, kl);
}
