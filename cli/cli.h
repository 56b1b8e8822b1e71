// cli.h - the `marlaas` command: subcommand entry points and small shared helpers.
#ifndef MARLAAS_CLI_H
#define MARLAAS_CLI_H

#include "common/formats/tokenizer.h"

int cmd_tasks(int argc, char **argv);
int cmd_pretrain(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_train_local(int argc, char **argv);
int cmd_init_model(int argc, char **argv);
int cmd_score(int argc, char **argv);
int cmd_tenant(int argc, char **argv);
int cmd_submit(int argc, char **argv);
int cmd_jobs(int argc, char **argv);
int cmd_status(int argc, char **argv);
int cmd_cancel(int argc, char **argv);
int cmd_metrics(int argc, char **argv);
int cmd_watch(int argc, char **argv);
int cmd_adapter(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_up(int argc, char **argv);
int cmd_down(int argc, char **argv);
int cmd_demo(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_keys(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_bench_api(int argc, char **argv);

// The character-level tokenizer of the models this project makes: printable ASCII
// (space to '~') and '\n', then the special tokens <|endoftext|> and <|pad|>.
tokenizer_t *cli_char_tokenizer(char *err);

// Parses a positive integer / float option value; prints a clear message and returns -1 on
// junk, so every command rejects bad flags the same way.
int cli_int(const char *opt, const char *v, long lo, long hi, long *out);
int cli_float(const char *opt, const char *v, double lo, double hi, double *out);
// The name of a file without its folder and last extension ("data/capitals.jsonl" ->
// "capitals"), cut to cap - 1 bytes at a UTF-8 character boundary; "dataset" when nothing is left.
void cli_file_stem(const char *path, char *out, size_t cap);
// The folder of the running marlaas binary (the services sit beside it).
void cli_bin_dir(char *out, size_t n);
// The default base model: models/tiny under the current directory (a clone), else the copy
// `make install` puts beside the binary (PREFIX/share/marlaas/models/tiny), else models/tiny.
const char *cli_default_model(void);

#endif
