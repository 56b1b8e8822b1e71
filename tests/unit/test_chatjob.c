// test_chatjob.c - RL jobs on chat models: the spec's chat fields, datasets of OpenAI-style
// "messages" (validation with file:line, canonical prompts for splits and evals, unknown keys),
// prompts rendered through real chat templates (rl_source_prompt against Jinja2's renderings of
// the same conversations in tests/chat/), the runtime's context bound and KV cache sizing, and
// hostile inputs (odd chat_vars, huge or malformed conversations, a template that raises).
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rl/jobspec.h"
#include "common/rl/rl.h"
#include "common/tasks/dataset.h"
#include "testutil.h"

// --- spec -----------------------------------------------------------------------------------

Test(chatjob, spec_chat_fields_round_trip) {
    jobspec_t s, t;
    char err[ERR_LEN];
    cr_assert_eq(jobspec_parse(&s,
                               "{\"task\": \"gsm\", \"dataset\": true, \"chat\": true, \"system\": \"Be brief.\\nThink.\","
                               " \"chat_vars\": {\"enable_thinking\": false, \"effort\": \"low\", \"n\": 3, \"x\": null}}",
                               err),
                 0, "%s", err);
    cr_assert(s.chat);
    cr_assert_str_eq(s.system, "Be brief.\nThink.");
    cr_assert_str_eq(s.chat_vars, "{\"enable_thinking\":false,\"effort\":\"low\",\"n\":3,\"x\":null}");
    char *js = jobspec_to_json(&s);
    cr_assert_eq(jobspec_parse(&t, js, err), 0, "%s: %s", err, js);
    cr_assert_eq(memcmp(&s, &t, sizeof s), 0, "round trip differs: %s", js);
    free(js);
    // a spec without chat writes no chat fields: stored specs of older jobs read back the same
    cr_assert_eq(jobspec_parse(&s, "{\"task\": \"add2\"}", err), 0, "%s", err);
    js = jobspec_to_json(&s);
    cr_assert_null(strstr(js, "chat"), "%s", js);
    cr_assert_null(strstr(js, "system"), "%s", js);
    free(js);
}

// Hostile or mistaken chat fields are refused with the field named.
Test(chatjob, spec_chat_fields_refused) {
    static const struct {
        const char *json, *want;
    } cases[] = {
        {"{\"task\": \"add2\", \"chat\": 1}", "spec.chat must be true or false"},
        {"{\"task\": \"add2\", \"system\": \"x\"}", "spec.system needs \"chat\": true"},
        {"{\"task\": \"add2\", \"chat_vars\": {\"a\": 1}}", "spec.chat_vars needs \"chat\": true"},
        {"{\"task\": \"add2\", \"chat\": true, \"system\": 5}", "spec.system must be a string"},
        {"{\"task\": \"add2\", \"chat\": true, \"system\": \"a\xff\"}", "spec.system is not valid UTF-8"},
        {"{\"task\": \"add2\", \"chat\": true, \"chat_vars\": [1]}", "spec.chat_vars must be an object"},
        {"{\"task\": \"add2\", \"chat\": true, \"chat_vars\": \"x\"}", "spec.chat_vars must be an object"},
        {"{\"task\": \"add2\", \"chat\": true, \"chat_vars\": {\"a\": [1, 2]}}", "spec.chat_vars.a must be true, false"},
        {"{\"task\": \"add2\", \"chat\": true, \"chat_vars\": {\"a\": {\"b\": 1}}}", "spec.chat_vars.a must be true, false"},
        {"{\"task\": \"add2\", \"chat\": true, \"chat_vars\": {\"1a\": 1}}", "'1a' is not a variable name"},
        {"{\"task\": \"add2\", \"chat\": true, \"chat_vars\": {\"a-b\": 1}}", "'a-b' is not a variable name"},
        {"{\"task\": \"add2\", \"chat\": true, \"chat_vars\": {\"\": 1}}", "is not a variable name"},
        {"{\"task\": \"add2\", \"chat\": true, \"chat_vars\": {\"messages\": []}}", "spec.chat_vars.messages is set by the job"},
        {"{\"task\": \"add2\", \"chat\": true, \"chat_vars\": {\"add_generation_prompt\": false}}",
         "spec.chat_vars.add_generation_prompt is set by the job"},
        {"{\"task\": \"add2\", \"chat\": true, \"chat_vars\": {\"tools\": null}}", "spec.chat_vars.tools is set by the job"},
        {"{\"task\": \"tcalc\", \"chat\": true, \"env\": {\"max_turns\": 3}}", "multi-turn episodes"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        jobspec_t s;
        char err[ERR_LEN] = "";
        cr_assert_eq(jobspec_parse(&s, cases[i].json, err), -1, "accepted: %s", cases[i].json);
        cr_assert(strstr(err, cases[i].want), "%s: error '%s' lacks '%s'", cases[i].json, err, cases[i].want);
    }
    // sizes: a system message of 4096 bytes, 17 variables, a string variable of 1024 bytes
    char *big = malloc(8192), *json = malloc(16384);
    memset(big, 'a', JOBSPEC_MAX_SYSTEM);
    big[JOBSPEC_MAX_SYSTEM] = 0;
    snprintf(json, 16384, "{\"task\": \"add2\", \"chat\": true, \"system\": \"%s\"}", big);
    jobspec_t s;
    char err[ERR_LEN] = "";
    cr_assert_eq(jobspec_parse(&s, json, err), -1);
    cr_assert(strstr(err, "spec.system must be a string of at most 4095 bytes"), "%s", err);
    big[JOBSPEC_MAX_SYSTEM - 1] = 0;
    snprintf(json, 16384, "{\"task\": \"add2\", \"chat\": true, \"system\": \"%s\"}", big);
    cr_assert_eq(jobspec_parse(&s, json, err), 0, "%s", err);
    big[JOBSPEC_MAX_CHAT_VAR_STR] = 0;
    snprintf(json, 16384, "{\"task\": \"add2\", \"chat\": true, \"chat_vars\": {\"v\": \"%s\"}}", big);
    cr_assert_eq(jobspec_parse(&s, json, err), -1);
    cr_assert(strstr(err, "spec.chat_vars.v: a string of at most 1023 bytes"), "%s", err);
    int p = snprintf(json, 16384, "{\"task\": \"add2\", \"chat\": true, \"chat_vars\": {");
    for (int i = 0; i < 17; i++) p += snprintf(json + p, 16384 - (size_t)p, "%s\"v%d\": %d", i ? ", " : "", i, i);
    snprintf(json + p, 16384 - (size_t)p, "}}");
    cr_assert_eq(jobspec_parse(&s, json, err), -1);
    cr_assert(strstr(err, "more than 16 variables"), "%s", err);
    // 16 string variables of 1000 bytes: each is fine, together they exceed the JSON bound
    p = snprintf(json, 16384, "{\"task\": \"add2\", \"chat\": true, \"chat_vars\": {");
    big[1000] = 0;
    for (int i = 0; i < 16; i++) p += snprintf(json + p, 16384 - (size_t)p, "%s\"v%d\": \"%s\"", i ? ", " : "", i, big);
    snprintf(json + p, 16384 - (size_t)p, "}}");
    cr_assert_eq(jobspec_parse(&s, json, err), -1);
    cr_assert(strstr(err, "spec.chat_vars is longer than 2047 bytes"), "%s", err);
    free(big);
    free(json);
}

// --- datasets of messages -----------------------------------------------------------------------

static dataset_t *parse(const char *text, char *err) { return dataset_parse("t.jsonl", text, strlen(text), NULL, err); }

static void refused(const char *text, const char *frag1, const char *frag2) {
    char err[ERR_LEN] = "";
    dataset_t *d = parse(text, err);
    cr_assert_null(d, "accepted: %s", text);
    cr_assert(strstr(err, frag1), "error '%s' lacks '%s'", err, frag1);
    if (frag2) cr_assert(strstr(err, frag2), "error '%s' lacks '%s'", err, frag2);
}

Test(chatjob, messages_records_are_validated_with_their_line) {
    const char *ok = "{\"prompt\": \"p\", \"answer\": \"a\"}\n";
    char text[1024];
    static const struct {
        const char *rec, *want;
    } cases[] = {
        {"{\"messages\": \"hi\", \"answer\": \"a\"}", "\"messages\" must be an array"},
        {"{\"messages\": [], \"answer\": \"a\"}", "1..256 messages, not 0"},
        {"{\"messages\": [\"hi\"], \"answer\": \"a\"}", "messages[0] is not an object"},
        {"{\"messages\": [{\"role\": \"user\"}], \"answer\": \"a\"}", "messages[0].content must be a string"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": null}], \"answer\": \"a\"}", "messages[0].content must be a string"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"hi\"}]}], \"answer\": \"a\"}",
         "messages[0].content must be a string"},
        {"{\"messages\": [{\"content\": \"hi\"}], \"answer\": \"a\"}", "messages[0].role must be"},
        {"{\"messages\": [{\"role\": \"tool\", \"content\": \"hi\"}], \"answer\": \"a\"}", "messages[0].role must be"},
        {"{\"messages\": [{\"role\": \"User\", \"content\": \"hi\"}], \"answer\": \"a\"}", "messages[0].role must be"},
        {"{\"messages\": [{\"role\": 1, \"content\": \"hi\"}], \"answer\": \"a\"}", "messages[0].role must be"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\", \"name\": \"x\"}], \"answer\": \"a\"}",
         "messages[0]: unknown key \"name\""},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"system\", \"content\": \"s\"}, "
         "{\"role\": \"user\", \"content\": \"hi\"}], \"answer\": \"a\"}",
         "messages[1]: a system message may only come first"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"x\"}], "
         "\"answer\": \"a\"}",
         "the last message must be the user's"},
        {"{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}], \"answer\": \"a\"}", "the last message must be the user's"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"\"}], \"answer\": \"a\"}", "messages[0]: empty user content"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"ab\xc3\x28\"}], \"answer\": \"a\"}",
         "messages[0].content is not valid UTF-8 (byte 3)"},
        {"{\"prompt\": \"\xed\xa0\x80\", \"answer\": \"a\"}", "\"prompt\" is not valid UTF-8 (byte 1)"},
        {"{\"prompt\": \"p\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"answer\": \"a\"}",
         "not both"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", "missing \"answer\""},
        {"{\"answer\": \"a\"}", "missing \"prompt\" (or \"messages\")"},
        {"{\"prompt\": \"p\", \"answer\": \"a\", \"system\": \"s\"}", "unknown key \"system\""},
        {"{\"prompt\": \"p\", \"answer\": \"a\", \"tools\": []}", "unknown key \"tools\""},
        {"{\"prompt\": \"p\", \"answers\": \"a\", \"answer\": \"a\"}", "unknown key \"answers\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(text, sizeof text, "%s\n%s%s\n", ok, ok, cases[i].rec);
        refused(text, "t.jsonl:4:", cases[i].want);
    }
    // 257 messages
    size_t cap = 64 * 1024;
    char *big = malloc(cap);
    int p = snprintf(big, cap, "{\"answer\": \"a\", \"messages\": [");
    for (int i = 0; i < 257; i++)
        p += snprintf(big + p, cap - (size_t)p, "%s{\"role\": \"%s\", \"content\": \"m\"}", i ? ", " : "",
                      i % 2 ? "assistant" : "user");
    snprintf(big + p, cap - (size_t)p, "]}\n");
    refused(big, "t.jsonl:1:", "1..256 messages, not 257");
    // a content as long as a line may be: the line limit refuses it, by its line
    memset(big, 0, cap);
    p = snprintf(big, cap, "%s{\"answer\": \"a\", \"messages\": [{\"role\": \"user\", \"content\": \"", ok);
    while ((size_t)p < cap - 16) big[p++] = 'x';
    strcpy(big + p, "\"}]}\n");
    size_t n = strlen(big) + DATASET_MAX_LINE;
    char *huge = malloc(n + 1);
    memcpy(huge, big, strlen(big) - 5);
    memset(huge + strlen(big) - 5, 'y', DATASET_MAX_LINE);
    strcpy(huge + strlen(big) - 5 + DATASET_MAX_LINE, "\"}]}\n");
    refused(huge, "t.jsonl:2:", "line longer than");
    free(huge);
    free(big);
}

Test(chatjob, messages_records_load_with_canonical_prompts) {
    const char *text =
        "{\"id\": 7, \"source\": \"gsm8k\", \"messages\": [{\"role\": \"user\", \"content\": \"What is 2+2?\"}], "
        "\"answer\": \"4\"}\n"
        "{\"messages\": [{\"content\": \"Be brief.\", \"role\": \"system\"}, {\"role\": \"user\", \"content\": \"What is 2+3?\"}], "
        "\"answer\": \"5\", \"metadata\": {\"level\": 1}}\n"
        "{\"prompt\": \"What is 2+2?\", \"answer\": \"4\"}\n"
        "{\"messages\": [{\"role\": \"system\", \"content\": \"\"}, {\"role\": \"user\", \"content\": \"Hi\"}, "
        "{\"role\": \"assistant\", \"content\": \"Hello.\"}, {\"role\": \"user\", \"content\": \"2+4?\"}], \"answer\": \"6\"}\n";
    char err[ERR_LEN];
    dataset_t *d = parse(text, err);
    cr_assert_not_null(d, "%s", err);
    cr_assert_eq(dataset_size(d), 4);
    // a lone user message is its content; a conversation its compact JSON, keys role then content
    cr_assert_str_eq(dataset_record_prompt(d, 0), "What is 2+2?");
    cr_assert_str_eq(dataset_messages(d, 0), "[{\"role\":\"user\",\"content\":\"What is 2+2?\"}]");
    cr_assert_str_eq(dataset_record_prompt(d, 1),
                     "[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"What is 2+3?\"}]");
    cr_assert_str_eq(dataset_messages(d, 1), dataset_record_prompt(d, 1));
    cr_assert_null(dataset_messages(d, 2));
    cr_assert_str_eq(dataset_record_prompt(d, 3),
                     "[{\"role\":\"system\",\"content\":\"\"},{\"role\":\"user\",\"content\":\"Hi\"},"
                     "{\"role\":\"assistant\",\"content\":\"Hello.\"},{\"role\":\"user\",\"content\":\"2+4?\"}]");
    cr_assert_eq(dataset_messages_line(d), 1);
    cr_assert_eq(dataset_system_line(d), 2);
    cr_assert_eq(dataset_record_line(d, 3), 4);
    // fewer than 10 records: every record in both splits; the eval list holds each distinct
    // prompt once, and record 0 and record 2 are one prompt
    cr_assert_eq(dataset_split_size(d, TASK_TRAIN), 4);
    cr_assert_eq(dataset_split_size(d, TASK_EVAL), 3);
    rl_source_t src = {.ds = d};
    uint64_t *idx = NULL;
    cr_assert_eq(rl_source_eval_indices(&src, 10, &idx), 3);
    free(idx);
    task_example_t ex = {0};
    cr_assert_eq(dataset_example(d, TASK_EVAL, 0, &ex), 0);
    cr_assert_eq(dataset_verify(d, 0, "4"), 1.0f);
    task_example_free(&ex);
    dataset_destroy(&d);
}

// Splits follow the canonical text: a "messages" record with one user message lands where a
// "prompt" record with the same text does, whatever the surrounding records.
Test(chatjob, messages_split_like_their_prompt) {
    char *text = malloc(1 << 16), err[ERR_LEN];
    int p = 0;
    for (int i = 0; i < 200; i++)
        p += snprintf(text + p, (1u << 16) - (size_t)p,
                      i % 2 ? "{\"prompt\": \"q%d\", \"answer\": \"a\"}\n"
                            : "{\"messages\": [{\"role\": \"user\", \"content\": \"q%d\"}], \"answer\": \"a\"}\n",
                      i);
    dataset_t *d = parse(text, err);
    cr_assert_not_null(d, "%s", err);
    int ne = dataset_split_size(d, TASK_EVAL), nt = dataset_split_size(d, TASK_TRAIN);
    cr_assert_eq(ne + nt, 200);
    for (int k = 0; k < ne; k++) {
        task_example_t ex = {0};
        dataset_example(d, TASK_EVAL, (uint64_t)k, &ex);
        cr_assert_eq(task_prompt_split(ex.prompt), TASK_EVAL, "%s", ex.prompt);
        task_example_free(&ex);
    }
    dataset_destroy(&d);
    free(text);
}

// --- prompts through real templates -------------------------------------------------------------

static chat_template_t *load_template(const char *family) {
    char path[256], err[ERR_LEN];
    size_t n;
    snprintf(path, sizeof path, "tests/chat/templates/%s.json", family);
    char *cfg = util_read_file(path, &n, err);
    cr_assert_not_null(cfg, "%s", err);
    chat_template_t *ct = chat_template_from_config(cfg, n, NULL, err);
    cr_assert_not_null(ct, "%s: %s", path, err);
    free(cfg);
    return ct;
}

// The conversation of tests/chat/conversations.jsonl with id `id`, and Jinja2's rendering of it
// with `family`'s template (tests/chat/expected/chat.json); NULL output when Jinja2 raised.
static cJSON *conversations, *expected;

static void load_fixtures(void) {
    char err[ERR_LEN];
    size_t n;
    char *t = util_read_file("tests/chat/expected/chat.json", &n, err);
    cr_assert_not_null(t, "%s", err);
    expected = cJSON_Parse(t);
    free(t);
    t = util_read_file("tests/chat/conversations.jsonl", &n, err);
    cr_assert_not_null(t, "%s", err);
    conversations = cJSON_CreateObject();
    for (char *line = strtok(t, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *c = cJSON_Parse(line);
        cJSON_AddItemToObject(conversations, cJSON_GetObjectItem(c, "id")->valuestring,
                              cJSON_DetachItemFromObject(c, "request"));
        cJSON_Delete(c);
    }
    free(t);
}

static void free_fixtures(void) {
    cJSON_Delete(conversations);
    cJSON_Delete(expected);
}

static const char *expected_output(const char *family, const char *id) {
    const cJSON *o = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(expected, "templates"), family), id);
    const cJSON *out = cJSON_GetObjectItem(o, "output");
    return cJSON_IsString(out) ? out->valuestring : NULL;
}

// Every conversation of the fixtures that a dataset record can hold (role and content only, a
// user message last, the generation prompt on; llama3_2's template prints today's date), as a "messages" record, renders through
// rl_source_prompt exactly as Jinja2 renders it; a lone user message also as a "prompt" record,
// the first system message also as spec.system, and enable_thinking also as chat_vars.
Test(chatjob, prompts_equal_jinja2_renderings, .init = load_fixtures, .fini = free_fixtures) {
    static const char *const families[] = {"qwen3", "llama3", "llama3_1", "gemma3", "deepseek_v3", "llama2"};
    int checked = 0;
    for (size_t f = 0; f < sizeof families / sizeof families[0]; f++) {
        chat_template_t *ct = load_template(families[f]);
        const cJSON *conv;
        cJSON_ArrayForEach(conv, conversations) {
            const char *id = conv->string, *want = expected_output(families[f], id);
            const cJSON *msgs = cJSON_GetObjectItem(conv, "messages");
            if (!want || !cJSON_IsTrue(cJSON_GetObjectItem(conv, "add_generation_prompt"))) continue;
            // extra request members other than enable_thinking are not what a job gives
            const cJSON *m;
            bool plain = true;
            int nvars = 0;
            cJSON_ArrayForEach(m, conv) nvars += strcmp(m->string, "messages") && strcmp(m->string, "add_generation_prompt");
            const cJSON *think = cJSON_GetObjectItem(conv, "enable_thinking");
            if (nvars > (think ? 1 : 0)) continue;
            cJSON_ArrayForEach(m, msgs) plain &= cJSON_GetArraySize(m) == 2 && cJSON_IsString(cJSON_GetObjectItem(m, "content"));
            if (!plain) continue;
            // as a dataset record (unless the dataset refuses the conversation)
            cJSON *rec = cJSON_CreateObject();
            cJSON_AddItemToObject(rec, "messages", cJSON_Duplicate(msgs, true));
            cJSON_AddStringToObject(rec, "answer", "x");
            char *line = cJSON_PrintUnformatted(rec), err[ERR_LEN];
            cJSON_Delete(rec);
            dataset_t *d = parse(line, err);
            free(line);
            if (!d) continue;
            char vars[64] = "";
            if (think) snprintf(vars, sizeof vars, "{\"enable_thinking\":%s}", cJSON_IsTrue(think) ? "true" : "false");
            rl_source_t src = {.ds = d};
            snprintf(src.name, sizeof src.name, "t.jsonl");
            cr_assert_eq(rl_source_set_chat(&src, ct, NULL, NULL, vars, err), 0, "%s", err);
            task_example_t ex = {0};
            int h = dataset_example(d, TASK_TRAIN, 0, &ex);
            char *got = rl_source_prompt(&src, &ex, h, err);
            cr_assert_not_null(got, "%s/%s: %s", families[f], id, err);
            cr_assert_str_eq(got, want, "%s/%s as a messages record", families[f], id);
            free(got);
            checked++;
            // the same through the spec's system message and a plain prompt
            int n = cJSON_GetArraySize(msgs);
            const cJSON *first = cJSON_GetArrayItem(msgs, 0), *last = cJSON_GetArrayItem(msgs, n - 1);
            bool sys = !strcmp(cJSON_GetObjectItem(first, "role")->valuestring, "system");
            if (n == 1 + sys && !(sys && !cJSON_GetObjectItem(first, "content")->valuestring[0])) {
                task_example_t pe = {.prompt = cJSON_GetObjectItem(last, "content")->valuestring};
                rl_source_t ps = {0};
                cr_assert_eq(rl_source_set_chat(&ps, ct, NULL, sys ? cJSON_GetObjectItem(first, "content")->valuestring : NULL,
                                                vars, err),
                             0, "%s", err);
                got = rl_source_prompt(&ps, &pe, 0, err);
                cr_assert_not_null(got, "%s/%s: %s", families[f], id, err);
                cr_assert_str_eq(got, want, "%s/%s as a prompt with spec.system", families[f], id);
                free(got);
                checked++;
            }
            task_example_free(&ex);
            dataset_destroy(&d);
        }
        chat_template_destroy(&ct);
    }
    cr_assert_gt(checked, 60, "only %d renderings checked", checked);
}

Test(chatjob, prompt_errors) {
    char err[ERR_LEN];
    // a template that raises on every request: the error names the dataset's line
    const char *cfg = "{\"chat_template\": \"{{ raise_exception('no ' ~ messages[0].role ~ ' here') }}\"}";
    chat_template_t *ct = chat_template_from_config(cfg, strlen(cfg), NULL, err);
    cr_assert_not_null(ct, "%s", err);
    dataset_t *d = parse("{\"prompt\": \"a\", \"answer\": \"1\"}\n"
                         "{\"messages\": [{\"role\": \"user\", \"content\": \"b\"}], \"answer\": \"2\"}\n",
                         err);
    cr_assert_not_null(d, "%s", err);
    rl_source_t src = {.ds = d};
    snprintf(src.name, sizeof src.name, "data.jsonl");
    cr_assert_eq(rl_source_set_chat(&src, ct, NULL, NULL, NULL, err), 0);
    task_example_t ex = {.prompt = (char *)dataset_record_prompt(d, 1)};
    cr_assert_null(rl_source_prompt(&src, &ex, 1, err));
    cr_assert(strstr(err, "data.jsonl:2: chat template: ") && strstr(err, "no user here"), "%s", err);
    chat_template_destroy(&ct);
    // a "messages" record without chat
    rl_source_t plain = {.ds = d};
    snprintf(plain.name, sizeof plain.name, "data.jsonl");
    cr_assert_null(rl_source_prompt(&plain, &ex, 1, err));
    cr_assert(strstr(err, "data.jsonl:2: a \"messages\" record needs a chat job"), "%s", err);
    // a "prompt" record without chat is the prompt itself
    ex.prompt = (char *)dataset_record_prompt(d, 0);
    char *got = rl_source_prompt(&plain, &ex, 0, err);
    cr_assert_str_eq(got, "a");
    free(got);
    // no template: the reason the runtime recorded
    cr_assert_eq(rl_source_set_chat(&plain, NULL, "M/tokenizer_config.json: no such file", NULL, NULL, err), -1);
    cr_assert(strstr(err, "no such file"), "%s", err);
    // a template whose output breaks its limit
    const char *loop = "{\"chat_template\": \"{% for i in range(100000) %}{{ messages[0].content }}{% endfor %}\"}";
    ct = chat_template_from_config(loop, strlen(loop), NULL, err);
    cr_assert_not_null(ct, "%s", err);
    cr_assert_eq(rl_source_set_chat(&src, ct, NULL, NULL, NULL, err), 0);
    dataset_destroy(&d);
    char line[4096];
    memset(line, 'z', 1000);
    line[1000] = 0;
    char rec[4200];
    snprintf(rec, sizeof rec, "{\"prompt\": \"%s\", \"answer\": \"1\"}\n", line);
    d = parse(rec, err);
    src.ds = d;
    ex.prompt = (char *)dataset_record_prompt(d, 0);
    cr_assert_null(rl_source_prompt(&src, &ex, 0, err));
    cr_assert(strstr(err, "data.jsonl:1: chat template: "), "%s", err);
    dataset_destroy(&d);
    chat_template_destroy(&ct);
}

// --- the runtime's context and KV cache -----------------------------------------------------------

static rl_runtime_t *runtime(int max_pos, const rl_runtime_cfg_t *cfg, char *err) {
    hf_config_t c = tu_config();
    c.max_position_embeddings = max_pos;
    model_t *m = tu_model(&c, 5);
    static const char *const vocab[] = {"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"};
    static const char *const specials[] = {"<|endoftext|>"};
    tokenizer_t *t = tokenizer_build(vocab, 10, NULL, 0, specials, 1, err);
    cr_assert_not_null(t, "%s", err);
    return rl_runtime_wrap(&m, &t, cfg, err);
}

// rl.h's rule: C = min(model's context, 4096) unless set (never beyond the model's); blocks =
// min(256 contexts, max(one context + 2, budget)).
Test(chatjob, runtime_bounds_its_context_and_sizes_its_cache) {
    char err[ERR_LEN];
    // tu_config: 2 layers, 2 KV heads of 8: 2 * 4 * 16 * 2 * 2 * 8 = 4096 bytes per block
    rl_runtime_t *rt = runtime(40960, &(rl_runtime_cfg_t){.kv_mb = 1}, err);
    cr_assert_not_null(rt, "%s", err);
    cr_assert_eq(rt->max_context, RL_DEFAULT_CONTEXT);
    // the budget (256 blocks) is below one context (256 blocks + 2): one context it is
    cr_assert_eq(kvcache_total_blocks(rt->kc), 4096 / 16 + 2);
    rl_runtime_close(&rt);
    rt = runtime(40960, &(rl_runtime_cfg_t){.kv_mb = 3}, err);
    cr_assert_eq(kvcache_total_blocks(rt->kc), 3 * 256);
    rl_runtime_close(&rt);
    // a small context: 256 contexts, well within the default budget
    rt = runtime(40960, &(rl_runtime_cfg_t){.max_context = 100}, err);
    cr_assert_not_null(rt, "%s", err);
    cr_assert_eq(rt->max_context, 100);
    cr_assert_eq(kvcache_total_blocks(rt->kc), 256 * 7);
    // a request beyond the served context is the caller's to refuse: the eval helpers do
    rl_runtime_close(&rt);
    rt = runtime(128, NULL, err);
    cr_assert_eq(rt->max_context, 128);
    cr_assert_eq(kvcache_total_blocks(rt->kc), 256 * 8);
    rl_runtime_close(&rt);
    cr_assert_null(runtime(128, &(rl_runtime_cfg_t){.max_context = 129}, err));
    cr_assert(strstr(err, "max_context 129: the model computes 128 positions at most"), "%s", err);
    // an explicit block count wins
    rt = runtime(40960, &(rl_runtime_cfg_t){.kv_blocks = 40}, err);
    cr_assert_eq(kvcache_total_blocks(rt->kc), 40);
    cr_assert_null(rt->chat);
    cr_assert(rt->chat_error[0]);
    rl_runtime_close(&rt);
}

// --- PEFT files for real architectures ------------------------------------------------------------

// The adapter files of a job on a real checkpoint's architecture are what Hugging Face peft loads
// onto that model: every tensor named base_model.model.model.layers.N.{self_attn,mlp}.X.lora_{A,B}.weight
// with lora_A (r, in_features) and lora_B (out_features, r) of the model's nn.Linear, and an
// adapter_config.json with peft_type, task_type, r, lora_alpha, target_modules and
// base_model_name_or_path. The shapes here come from config.json's numbers directly (the
// safetensors header is read as JSON, not through this code base's reader).
Test(chatjob, peft_files_match_real_architectures) {
    static const char *const cfgs[] = {"qwen3-0.6b", "llama-3.2-1b", "qwen2.5-0.5b", "smollm2-135m"};
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
        char path[512], err[ERR_LEN], dir[256];
        snprintf(path, sizeof path, "tests/reference/configs/%s.json", cfgs[c]);
        char *txt = util_read_file(path, NULL, err);
        cr_assert_not_null(txt, "%s", err);
        hf_config_t mc;
        cr_assert_eq(hf_config_parse(&mc, txt, err), 0, "%s: %s", path, err);
        cJSON *j = cJSON_Parse(txt);
        free(txt);
        int D = cJSON_GetObjectItem(j, "hidden_size")->valueint, F = cJSON_GetObjectItem(j, "intermediate_size")->valueint,
            L = cJSON_GetObjectItem(j, "num_hidden_layers")->valueint, H = cJSON_GetObjectItem(j, "num_attention_heads")->valueint;
        const cJSON *kvj = cJSON_GetObjectItem(j, "num_key_value_heads"), *hdj = cJSON_GetObjectItem(j, "head_dim");
        int KV = kvj ? kvj->valueint : H, hd = cJSON_IsNumber(hdj) ? hdj->valueint : D / H;
        cJSON_Delete(j);
        // in / out features of q, k, v, o, gate, up, down as the modelling code builds its nn.Linear
        const int in[7] = {D, D, D, H * hd, D, D, F}, out[7] = {H * hd, KV * hd, KV * hd, D, F, F, D};
        static const char *const mod[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};
        int r = 4;
        unsigned targets = c % 2 ? LORA_ALL_TARGETS : (1u << LORA_Q) | (1u << LORA_O) | (1u << LORA_DOWN);
        peft_config_t pc = {.r = r, .alpha = 8, .targets = targets};
        snprintf(pc.base_model, sizeof pc.base_model, "org/%s", cfgs[c]);
        lora_t *a = lora_new(&mc, &pc, kernels_cpu(), 1, err);
        cr_assert_not_null(a, "%s", err);
        tu_tmpdir(dir, sizeof dir, "peft-real");
        cr_assert_eq(lora_save(a, dir, err), 0, "%s", err);
        lora_destroy(&a);
        snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
        size_t n;
        char *st = util_read_file(path, &n, err);
        cr_assert_not_null(st, "%s", err);
        uint64_t hl = 0;
        for (int i = 7; i >= 0; i--) hl = hl << 8 | (uint8_t)st[i];
        cr_assert_leq(8 + hl, n);
        cJSON *hdr = cJSON_ParseWithLength(st + 8, hl);
        cr_assert_not_null(hdr);
        int tensors = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, hdr) tensors += strcmp(e->string, "__metadata__") != 0;
        int want_tensors = 0;
        for (int t = 0; t < 7; t++) {
            if (!(targets & (1u << t))) continue;
            want_tensors += 2 * L;
            for (int l = 0; l < L; l++)
                for (int ab = 0; ab < 2; ab++) {
                    char name[160];
                    snprintf(name, sizeof name, "base_model.model.model.layers.%d.%s.lora_%c.weight", l, mod[t], ab ? 'B' : 'A');
                    const cJSON *ti = cJSON_GetObjectItem(hdr, name);
                    cr_assert_not_null(ti, "%s: %s missing", cfgs[c], name);
                    const cJSON *shape = cJSON_GetObjectItem(ti, "shape");
                    cr_assert_eq(cJSON_GetArraySize(shape), 2);
                    int d0 = cJSON_GetArrayItem(shape, 0)->valueint, d1 = cJSON_GetArrayItem(shape, 1)->valueint;
                    cr_assert(ab ? d0 == out[t] && d1 == r : d0 == r && d1 == in[t], "%s: %s is (%d, %d)", cfgs[c], name, d0, d1);
                    cr_assert_str_eq(cJSON_GetObjectItem(ti, "dtype")->valuestring, "F32");
                }
        }
        cr_assert_eq(tensors, want_tensors, "%s: %d tensors, %d expected", cfgs[c], tensors, want_tensors);
        cJSON_Delete(hdr);
        free(st);
        snprintf(path, sizeof path, "%s/adapter_config.json", dir);
        txt = util_read_file(path, NULL, err);
        cJSON *ac = cJSON_Parse(txt);
        free(txt);
        cr_assert_str_eq(cJSON_GetObjectItem(ac, "peft_type")->valuestring, "LORA");
        cr_assert_str_eq(cJSON_GetObjectItem(ac, "task_type")->valuestring, "CAUSAL_LM");
        cr_assert_eq(cJSON_GetObjectItem(ac, "r")->valueint, r);
        cr_assert_eq(cJSON_GetObjectItem(ac, "lora_alpha")->valuedouble, 8.0);
        snprintf(path, sizeof path, "org/%s", cfgs[c]);
        cr_assert_str_eq(cJSON_GetObjectItem(ac, "base_model_name_or_path")->valuestring, path);
        const cJSON *tm = cJSON_GetObjectItem(ac, "target_modules");
        int nt = 0;
        cJSON_ArrayForEach(e, tm) {
            bool found = false;
            for (int t = 0; t < 7; t++) found |= (targets & (1u << t)) && !strcmp(strchr(mod[t], '.') + 1, e->valuestring);
            cr_assert(found, "%s: unexpected target %s", cfgs[c], e->valuestring);
            nt++;
        }
        cr_assert_eq(nt, __builtin_popcount(targets));
        cJSON_Delete(ac);
    }
}
