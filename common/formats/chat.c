// chat.c - chat templates from tokenizer_config.json, rendered for a conversation (chat.h).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "common/formats/chat.h"

#define CHAT_MAX_TEMPLATES 32

typedef struct {
    char *name;
    jinja_tpl_t *tpl;   // NULL: parse_err says why
    char parse_err[ERR_LEN];
} chat_entry_t;

struct chat_template {
    chat_entry_t t[CHAT_MAX_TEMPLATES];
    int n;
    cJSON *tokens;          // the special tokens: {name: string or list of strings}
};

// The special tokens HF hands the template (PreTrainedTokenizerBase.SPECIAL_TOKENS_ATTRIBUTES).
static const char *const TOKEN_NAMES[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                          "pad_token", "cls_token", "mask_token"};

// A token as the config writes it: "text", {"content": "text", ...} (AddedToken) or null.
static int token_text(const cJSON *v, const char *name, const char **out, char *err) {
    *out = NULL;
    if (!v || cJSON_IsNull(v)) return 0;
    if (cJSON_IsString(v)) {
        *out = v->valuestring;
        return 0;
    }
    const cJSON *content = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "content") : NULL;
    if (cJSON_IsString(content)) {
        *out = content->valuestring;
        return 0;
    }
    return err_set(err, "tokenizer_config.json: %s must be a string, an AddedToken object with \"content\", or null",
                   name);
}

static int add_template(chat_template_t *ct, const char *name, const char *text, char *err) {
    for (int i = 0; i < ct->n; i++)
        if (!strcmp(ct->t[i].name, name)) return err_set(err, "tokenizer_config.json: chat template '%s' appears twice", name);
    if (ct->n == CHAT_MAX_TEMPLATES) return err_set(err, "tokenizer_config.json: more than %d chat templates", CHAT_MAX_TEMPLATES);
    chat_entry_t *e = &ct->t[ct->n++];
    e->name = xstrdup(name);
    e->tpl = jinja_parse(text, strlen(text), e->parse_err);
    return 0;
}

static int bind_tokens(chat_template_t *ct, const cJSON *cfg, char *err) {
    ct->tokens = cJSON_CreateObject();
    for (size_t i = 0; i < sizeof TOKEN_NAMES / sizeof TOKEN_NAMES[0]; i++) {
        const char *s;
        if (token_text(cJSON_GetObjectItemCaseSensitive(cfg, TOKEN_NAMES[i]), TOKEN_NAMES[i], &s, err)) return -1;
        // HF's special_tokens_map leaves out what is unset or empty
        if (s && *s) cJSON_AddStringToObject(ct->tokens, TOKEN_NAMES[i], s);
    }
    const cJSON *extra = cJSON_GetObjectItemCaseSensitive(cfg, "additional_special_tokens");
    if (extra && !cJSON_IsNull(extra)) {
        if (!cJSON_IsArray(extra)) return err_set(err, "tokenizer_config.json: additional_special_tokens must be a list");
        cJSON *list = cJSON_CreateArray();
        const cJSON *x;
        cJSON_ArrayForEach(x, extra) {
            const char *s;
            if (token_text(x, "an additional special token", &s, err) || !s) {
                cJSON_Delete(list);
                return s ? -1 : err_set(err, "tokenizer_config.json: additional_special_tokens holds a null");
            }
            cJSON_AddItemToArray(list, cJSON_CreateString(s));
        }
        if (cJSON_GetArraySize(list)) cJSON_AddItemToObject(ct->tokens, "additional_special_tokens", list);
        else cJSON_Delete(list);
    }
    // extra_special_tokens {"name": token}: HF makes each a special-token attribute too
    const cJSON *named = cJSON_GetObjectItemCaseSensitive(cfg, "extra_special_tokens");
    if (cJSON_IsObject(named)) {
        const cJSON *x;
        cJSON_ArrayForEach(x, named) {
            const char *s;
            if (token_text(x, x->string, &s, err)) return -1;
            if (s && *s) {
                cJSON_DeleteItemFromObjectCaseSensitive(ct->tokens, x->string);
                cJSON_AddStringToObject(ct->tokens, x->string, s);
            }
        }
    } else if (named && !cJSON_IsNull(named) && !cJSON_IsArray(named)) {
        // (a list, in newer configs, names no attributes)
        return err_set(err, "tokenizer_config.json: extra_special_tokens must be an object or a list");
    }
    return 0;
}

chat_template_t *chat_template_from_config(const char *config, size_t len, const char *jinja, char *err) {
    cJSON *cfg = cJSON_ParseWithLength(config, len);
    if (!cfg || !cJSON_IsObject(cfg)) {
        cJSON_Delete(cfg);
        err_set(err, "tokenizer_config.json is not a JSON object");
        return NULL;
    }
    chat_template_t *ct = xcalloc(1, sizeof *ct);
    const cJSON *tpl = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    int rc = bind_tokens(ct, cfg, err);
    if (!rc && jinja) rc = add_template(ct, "default", jinja, err);
    if (!rc && cJSON_IsString(tpl)) {
        if (!jinja) rc = add_template(ct, "default", tpl->valuestring, err);
    } else if (!rc && cJSON_IsArray(tpl)) {
        const cJSON *x;
        cJSON_ArrayForEach(x, tpl) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(x, "name");
            const cJSON *text = cJSON_GetObjectItemCaseSensitive(x, "template");
            if (!cJSON_IsString(name) || !cJSON_IsString(text)) {
                rc = err_set(err, "tokenizer_config.json: each chat_template entry needs string \"name\" and \"template\"");
                break;
            }
            if (jinja && !strcmp(name->valuestring, "default")) continue;
            if ((rc = add_template(ct, name->valuestring, text->valuestring, err))) break;
        }
    } else if (!rc && tpl && !cJSON_IsNull(tpl)) {
        rc = err_set(err, "tokenizer_config.json: chat_template must be a string or a list of {name, template}");
    }
    if (!rc && ct->n == 0)
        rc = err_set(err, "the model has no chat template (tokenizer_config.json has no chat_template and there is "
                          "no chat_template.jinja)");
    cJSON_Delete(cfg);
    if (rc) chat_template_destroy(&ct);
    return ct;
}

chat_template_t *chat_template_load(const char *model_dir, char *err) {
    char path[4096], jpath[4096], e2[ERR_LEN];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", model_dir);
    snprintf(jpath, sizeof jpath, "%s/chat_template.jinja", model_dir);
    size_t len;
    char *cfg = util_read_file(path, &len, err);
    if (!cfg) return NULL;
    char *jinja = NULL;
    struct stat st;
    if (stat(jpath, &st) == 0) {
        jinja = util_read_file(jpath, NULL, e2);
        if (!jinja) {
            free(cfg);
            err_set(err, "%s", e2);
            return NULL;
        }
    }
    chat_template_t *ct = chat_template_from_config(cfg, len, jinja, e2);
    if (!ct) err_set(err, "%s: %s", path, e2);
    free(cfg);
    free(jinja);
    return ct;
}

void chat_template_destroy(chat_template_t **ct) {
    if (!ct || !*ct) return;
    for (int i = 0; i < (*ct)->n; i++) {
        free((*ct)->t[i].name);
        jinja_destroy(&(*ct)->t[i].tpl);
    }
    cJSON_Delete((*ct)->tokens);
    free(*ct);
    *ct = NULL;
}

int chat_template_count(const chat_template_t *ct) { return ct->n; }
const char *chat_template_name(const chat_template_t *ct, int i) { return i >= 0 && i < ct->n ? ct->t[i].name : NULL; }

static const chat_entry_t *find(const chat_template_t *ct, const char *name) {
    for (int i = 0; i < ct->n; i++)
        if (!strcmp(ct->t[i].name, name)) return &ct->t[i];
    return NULL;
}

// Python's str.strip() bounds of s (ASCII and the common Unicode spaces).
static bool is_py_space(const unsigned char *s, size_t n, size_t i, size_t *w) {
    *w = 1;
    if (s[i] == ' ' || (s[i] >= 0x09 && s[i] <= 0x0D) || (s[i] >= 0x1C && s[i] <= 0x1F)) return true;
    if (s[i] == 0xC2 && i + 1 < n && (s[i + 1] == 0x85 || s[i + 1] == 0xA0)) {
        *w = 2;
        return true;
    }
    if (i + 2 < n && s[i] == 0xE2 && ((s[i + 1] == 0x80 && (s[i + 2] <= 0x8A || s[i + 2] == 0xA8 || s[i + 2] == 0xA9 ||
                                                          s[i + 2] == 0xAF)) ||
                                      (s[i + 1] == 0x81 && s[i + 2] == 0x9F))) {
        *w = 3;
        return true;
    }
    if (i + 2 < n && ((s[i] == 0xE3 && s[i + 1] == 0x80 && s[i + 2] == 0x80) ||
                      (s[i] == 0xE1 && s[i + 1] == 0x9A && s[i + 2] == 0x80))) {
        *w = 3;
        return true;
    }
    return false;
}

static void py_strip(const char *s, size_t n, size_t *a, size_t *e) {
    const unsigned char *u = (const unsigned char *)s;
    size_t w;
    *a = 0;
    while (*a < n && is_py_space(u, n, *a, &w)) *a += w;
    *e = n;
    while (*e > *a) {
        size_t st = *e - 1;
        while (st > *a && (u[st] & 0xC0) == 0x80) st--;
        if (!is_py_space(u, n, st, &w) || st + w != *e) break;
        *e = st;
    }
}

// HF's continue_final_message: the prompt ends right after the final message's text.
static int continue_final(char *text, size_t *len, const cJSON *messages, char *err) {
    const cJSON *last = cJSON_GetArrayItem(messages, cJSON_GetArraySize(messages) - 1);
    const cJSON *content = last ? cJSON_GetObjectItemCaseSensitive(last, "content") : NULL;
    const char *msg = NULL;
    if (cJSON_IsString(content)) {
        msg = content->valuestring;
    } else if (cJSON_IsArray(content)) {
        for (const cJSON *part = content->child ? content->child->prev : NULL; part; part = part == content->child ? NULL : part->prev) {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "text");
            if (t) {
                msg = cJSON_IsString(t) ? t->valuestring : NULL;
                break;
            }
        }
    }
    if (!msg) return err_set(err, "continue_final_message is set but the final message has no text to continue");
    size_t n = strlen(msg), a, e;
    py_strip(msg, n, &a, &e);
    size_t sl = e - a;
    // the last occurrence of the stripped text
    const char *found = NULL;
    for (size_t k = *len >= sl ? *len - sl + 1 : 0; k-- > 0;)
        if (!memcmp(text + k, msg + a, sl)) {
            found = text + k;
            break;
        }
    if (!found)
        return err_set(err, "continue_final_message is set but the final message does not appear in the rendered "
                            "chat (the template changes its text)");
    size_t loc = (size_t)(found - text), lstripped = n - a;
    if (loc + lstripped <= *len && !memcmp(text + loc, msg + a, lstripped) && a == 0) *len = loc + lstripped;
    else *len = loc + sl;
    text[*len] = 0;
    return 0;
}

char *chat_render(const chat_template_t *ct, const char *request, size_t len, const chat_opts_t *o, size_t *len_out,
                  char *err) {
    chat_opts_t dflt = {0};
    if (!o) o = &dflt;
    cJSON *req = cJSON_ParseWithLength(request, len);
    if (!req) {
        err_set(err, "the request is not valid JSON");
        return NULL;
    }
    char *out = NULL;
    jinja_vars_t *vars = NULL;
    const cJSON *messages = cJSON_IsArray(req) ? req : cJSON_GetObjectItemCaseSensitive(req, "messages");
    if (!cJSON_IsArray(req) && !cJSON_IsObject(req)) {
        err_set(err, "the request must be a JSON array of messages or an object with \"messages\"");
        goto done;
    }
    if (!cJSON_IsArray(messages)) {
        err_set(err, "the request needs \"messages\": a list of {\"role\", \"content\"} objects");
        goto done;
    }
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, messages) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role)) {
            err_set(err, "messages[%d] must be an object with a string \"role\"", i);
            goto done;
        }
        i++;
    }
    const cJSON *tools = cJSON_IsObject(req) ? cJSON_GetObjectItemCaseSensitive(req, "tools") : NULL;
    const cJSON *agp = cJSON_IsObject(req) ? cJSON_GetObjectItemCaseSensitive(req, "add_generation_prompt") : NULL;
    const cJSON *cfm = cJSON_IsObject(req) ? cJSON_GetObjectItemCaseSensitive(req, "continue_final_message") : NULL;
    if (tools && !cJSON_IsNull(tools) && !cJSON_IsArray(tools)) {
        err_set(err, "\"tools\" must be a list of tool definitions");
        goto done;
    }
    bool add_gen = o->add_generation_prompt;
    if (agp && !cJSON_IsNull(agp)) {
        if (!cJSON_IsBool(agp)) {
            err_set(err, "\"add_generation_prompt\" must be true or false");
            goto done;
        }
        if (o->force_generation_prompt && cJSON_IsTrue(agp) != o->add_generation_prompt) {
            err_set(err, "the request sets add_generation_prompt to %s, the options to %s",
                    cJSON_IsTrue(agp) ? "true" : "false", o->add_generation_prompt ? "true" : "false");
            goto done;
        }
        add_gen = cJSON_IsTrue(agp);
    }
    bool cont = false;
    if (cfm && !cJSON_IsNull(cfm)) {
        if (!cJSON_IsBool(cfm)) {
            err_set(err, "\"continue_final_message\" must be true or false");
            goto done;
        }
        cont = cJSON_IsTrue(cfm);
    }
    if (cont && add_gen) {
        err_set(err, "continue_final_message and add_generation_prompt are not compatible: continue_final_message "
                     "extends the last message, add_generation_prompt starts a new one");
        goto done;
    }
    if (cont && cJSON_GetArraySize(messages) == 0) {
        err_set(err, "continue_final_message needs a final message");
        goto done;
    }
    // the template: asked by name, else tool_use when there are tools, else default
    const chat_entry_t *e = NULL;
    if (o->template_name) {
        if (!(e = find(ct, o->template_name))) {
            char names[512] = "";
            for (int k = 0; k < ct->n; k++)
                snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", k ? ", " : "", ct->t[k].name);
            err_set(err, "the model has no chat template named '%s' (it has: %s)", o->template_name, names);
            goto done;
        }
    } else {
        if (cJSON_IsArray(tools)) e = find(ct, "tool_use");
        if (!e) e = find(ct, "default");
        if (!e && ct->n == 1) e = &ct->t[0];
        if (!e) {
            err_set(err, "the model has several chat templates and none is named 'default': choose one by name");
            goto done;
        }
    }
    if (!e->tpl) {
        err_set(err, "chat template '%s': %s", e->name, e->parse_err);
        goto done;
    }
    // the variables, as HF's render(messages=..., tools=..., documents=..., add_generation_prompt=...,
    // **special_tokens_map, **kwargs)
    vars = jinja_vars_new();
    static const char *const skip[] = {"add_generation_prompt", "continue_final_message", NULL};
    int rc = 0;
    const cJSON *tok;
    cJSON_ArrayForEach(tok, ct->tokens) {
        if ((rc = jinja_vars_set_cjson(vars, tok->string, tok, err))) break;
    }
    if (!rc) {
        if (cJSON_IsArray(req)) rc = jinja_vars_set_json(vars, "messages", request, len, err);
        else rc = jinja_vars_update_json(vars, request, len, skip, err);
    }
    if (rc) goto done;
    jinja_vars_set_bool(vars, "add_generation_prompt", add_gen);
    if (!jinja_vars_has(vars, "tools")) jinja_vars_set_none(vars, "tools");
    if (!jinja_vars_has(vars, "documents")) jinja_vars_set_none(vars, "documents");
    size_t n = 0;
    out = jinja_render(e->tpl, vars, o->limits, &n, err);
    if (out && cont && continue_final(out, &n, messages, err)) {
        free(out);
        out = NULL;
    }
    if (out && len_out) *len_out = n;
done:
    jinja_vars_destroy(&vars);
    cJSON_Delete(req);
    return out;
}
