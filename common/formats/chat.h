// chat.h - chat templates: a model's conversation rendered to its prompt text, as Hugging Face's
// tokenizer.apply_chat_template(..., tokenize=False) does.
//
// The template comes from tokenizer_config.json: "chat_template" is a string (the default) or a
// list of {"name", "template"}; a chat_template.jinja beside it replaces the default (as HF saves
// it). The template sees the variables HF gives it: messages, tools (null when none), documents
// (null when none), add_generation_prompt, the special tokens of the config that are set (bos_token,
// eos_token, unk_token, sep_token, pad_token, cls_token, mask_token as strings, also when written as
// AddedToken objects {"content": ...}; additional_special_tokens as a list; the names of
// extra_special_tokens), and every other member of the request (enable_thinking, ...), which
// override the special tokens. The output is text; tokenizing it is the tokenizer's job.
#ifndef MARLAAS_CHAT_H
#define MARLAAS_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "common/formats/jinja.h"

typedef struct chat_template chat_template_t;

// From the text of tokenizer_config.json; jinja (may be NULL) is a chat_template.jinja text that
// replaces the default template. Every template is parsed here; one this interpreter refuses is
// kept with its error, reported when it is chosen. NULL + err when the config is not JSON, has no
// chat template, or a token or template entry has the wrong type.
chat_template_t *chat_template_from_config(const char *config, size_t len, const char *jinja, char *err);
// DIR/tokenizer_config.json, and DIR/chat_template.jinja when present.
chat_template_t *chat_template_load(const char *model_dir, char *err);
void chat_template_destroy(chat_template_t **ct);

int chat_template_count(const chat_template_t *ct);
const char *chat_template_name(const chat_template_t *ct, int i);

typedef struct {
    const char *template_name;    // NULL: "tool_use" when the request has tools and the model has one,
                                  // else "default" (or the only template)
    bool add_generation_prompt;   // when the request does not say
    bool force_generation_prompt; // the request may not say otherwise (an explicit command-line flag)
    const jinja_limits_t *limits; // NULL: jinja_limits_default
} chat_opts_t;

// Renders a request: JSON text, either an array of messages or an object {"messages": [...],
// "tools": [...], "documents": [...], "add_generation_prompt": bool, "continue_final_message":
// bool, any other member: a template variable}. Each message is an object with a string "role";
// its content may be a string, null or a list of parts, and it may carry any other members
// (tool_calls, reasoning_content, ...). continue_final_message ends the prompt right after the
// last message's text, as HF does (for prefilling). Returns the prompt (owned by the caller) or
// NULL + err; a template's raise_exception starts with JINJA_RAISED_PREFIX.
char *chat_render(const chat_template_t *ct, const char *request, size_t len, const chat_opts_t *o, size_t *len_out,
                  char *err);

#endif
