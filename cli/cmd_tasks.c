// cmd_tasks.c - `marlaas tasks`: the built-in task families with an example each.
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "common/tasks/tasks.h"

int cmd_tasks(int argc, char **argv) {
    if (argc > 1) {
        if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
            printf("usage: marlaas tasks\nLists the built-in task families: name, family, example prompt -> answer.\n");
            return 0;
        }
        fprintf(stderr, "marlaas tasks: unexpected argument '%s'\n", argv[1]);
        return 2;
    }
    printf("%-14s %-11s %-34s %-14s %s\n", "task", "family", "example prompt", "answer", "description");
    for (int i = 0; i < task_count(); i++) {
        const task_t *t = task_at(i);
        task_example_t ex;
        task_example(t, TASK_EVAL, 0, &ex);
        printf("%-14s %-11s %-34s %-14s %s\n", t->name, t->family, ex.prompt, ex.answer, t->description);
        task_example_free(&ex);
    }
    printf("%d tasks\n", task_count());
    return 0;
}
