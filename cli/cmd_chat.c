// cmd_chat.c - `marlaas chat`: a conversation (JSON on stdin) rendered with a model's chat
// template to the prompt text (stdout), as Hugging Face's apply_chat_template(tokenize=False).
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/formats/chat.h"

// The largest conversation read from stdin.
#define CHAT_MAX_INPUT (64u << 20)

static void usage(void) {
    printf("usage: marlaas chat (--model DIR | --config FILE) [--template NAME] [--no-generation-prompt]\n"
           "       marlaas chat (--model DIR | --config FILE) --list-templates\n"
           "Reads a conversation as JSON on stdin and prints the prompt the model's chat template makes of it\n"
           "(exactly, without a trailing newline of its own).\n"
           "  --model DIR              the model folder: DIR/tokenizer_config.json (and DIR/chat_template.jinja)\n"
           "  --config FILE            a tokenizer_config.json\n"
           "  --template NAME          a named template of the config (default: tool_use when there are tools\n"
           "                           and the model has one, else default)\n"
           "  --no-generation-prompt   no assistant header at the end (default: add it)\n"
           "  --list-templates         print the template names and whether this interpreter supports them\n"
           "stdin: a list of messages [{\"role\": \"user\", \"content\": \"Hi\"}, ...], or an object\n"
           "  {\"messages\": [...], \"tools\": [...], \"add_generation_prompt\": true, \"continue_final_message\": false,\n"
           "   \"enable_thinking\": false, ...}: every other member is a template variable.\n");
}

static char *read_stdin(size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = xmalloc(cap);
    for (;;) {
        if (n == cap) {
            if (cap >= CHAT_MAX_INPUT) {
                free(buf);
                return NULL;
            }
            cap *= 2;
            buf = xrealloc(buf, cap);
        }
        size_t r = fread(buf + n, 1, cap - n, stdin);
        if (r == 0) break;
        n += r;
    }
    *len = n;
    return buf;
}

int cmd_chat(int argc, char **argv) {
    const char *model = NULL, *config = NULL, *name = NULL;
    bool no_gen = false, list = false;
    static struct option opts[] = {{"model", required_argument, 0, 'm'},
                                   {"config", required_argument, 0, 'c'},
                                   {"template", required_argument, 0, 't'},
                                   {"no-generation-prompt", no_argument, 0, 'n'},
                                   {"list-templates", no_argument, 0, 'l'},
                                   {"help", no_argument, 0, 'h'},
                                   {0}};
    int o;
    optind = 1;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'm': model = optarg; break;
        case 'c': config = optarg; break;
        case 't': name = optarg; break;
        case 'n': no_gen = true; break;
        case 'l': list = true; break;
        case 'h': usage(); return 0;
        default: usage(); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "marlaas chat: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!!model == !!config) {
        fprintf(stderr, "marlaas chat: give one of --model DIR or --config FILE\n");
        return 2;
    }
    char err[ERR_LEN];
    chat_template_t *ct;
    const char *where = NULL; // a config whose content was refused
    if (model) {
        ct = chat_template_load(model, err);
    } else {
        size_t len;
        char *text = util_read_file(config, &len, err);
        ct = text ? chat_template_from_config(text, len, NULL, err) : NULL;
        if (text && !ct) where = config;
        free(text);
    }
    if (!ct) {
        fprintf(stderr, "marlaas chat: %s%s%s\n", where ? where : "", where ? ": " : "", err);
        return 1;
    }
    if (list) {
        for (int i = 0; i < chat_template_count(ct); i++) printf("%s\n", chat_template_name(ct, i));
        chat_template_destroy(&ct);
        return 0;
    }
    size_t len;
    char *req = read_stdin(&len);
    if (!req) {
        fprintf(stderr, "marlaas chat: the conversation on stdin is larger than %u bytes\n", CHAT_MAX_INPUT);
        chat_template_destroy(&ct);
        return 1;
    }
    chat_opts_t co = {.template_name = name, .add_generation_prompt = !no_gen, .force_generation_prompt = no_gen};
    size_t n;
    char *prompt = chat_render(ct, req, len, &co, &n, err);
    int rc = 0;
    if (!prompt) {
        fprintf(stderr, "marlaas chat: %s\n", err);
        rc = 1;
    } else if (fwrite(prompt, 1, n, stdout) != n || fflush(stdout)) {
        fprintf(stderr, "marlaas chat: cannot write the prompt to stdout\n");
        rc = 1;
    }
    free(prompt);
    free(req);
    chat_template_destroy(&ct);
    return rc;
}
