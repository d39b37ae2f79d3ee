/*
 * cmd_pause.c: pqmq pause and pqmq resume (mq_pause, mq_resume): no poll
 * delivers a paused channel's messages until it is resumed.
 */
#include <stdlib.h>
#include <string.h>

#include "pqmq-tool.h"

static void pause_help(void)
{
    printf("usage: pqmq pause [--reason TEXT] CHANNEL...\n\n"
           "Pauses each channel (every args of that name): no consumer, runner or\n"
           "poll receives its messages until 'pqmq resume'. Messages in flight can\n"
           "still be completed; inserts go on. The pause is kept in the queue, so it\n"
           "outlasts restarts; a channel with no message yet may be paused. Prints\n"
           "one line per channel. Needs the administer duty.\n\n"
           "      --reason TEXT   why, shown by the dashboard\n%s",
           tool_common_help);
}

static void resume_help(void)
{
    printf("usage: pqmq resume CHANNEL...\n\n"
           "Resumes each paused channel and wakes its sleeping consumers. Prints one\n"
           "line per channel. Needs the administer duty.\n\n%s",
           tool_common_help);
}

/* Pauses (resume 0) or resumes the channels named after the options. */
static int pause_or_resume(tool *t, int argc, char **argv, int resume)
{
    static const struct option opts[] = {
        TOOL_COMMON_OPTS,
        {"reason", required_argument, NULL, 'r'},
        {NULL, 0, NULL, 0},
    };
    const char *reason = NULL;
    int c;
    while ((c = getopt_long(argc, argv, TOOL_COMMON_SHORT, opts, NULL)) != -1) {
        if (c == 'h') {
            if (resume)
                resume_help();
            else
                pause_help();
            return EXIT_OK;
        } else if (c == 'r' && !resume) {
            reason = optarg;
        } else if (c == 'r' || tool_common_opt(t, c, optarg)) {
            return c == 'r' ? tool_usage(t, "--reason goes with pqmq pause") : EXIT_USAGE;
        }
    }
    if (optind >= argc)
        return tool_usage(t, "name a channel (try 'pqmq %s --help')",
                          resume ? "resume" : "pause");
    for (int i = optind; i < argc; i++)
        if (!*argv[i])
            return tool_usage(t, "a channel name is empty");
    int rc = tool_connect(t, TOOL_MIN_VERSION);
    if (rc)
        return rc;
    for (int i = optind; i < argc; i++) {
        const char *p[2] = {argv[i], reason};
        PGresult *r = resume ? tool_query(t, "SELECT mq_resume($1)", 1, p)
                             : tool_query(t, "SELECT mq_pause($1, $2)", 2, p);
        if (!r)
            return EXIT_ERR;
        int changed = !strcmp(PQgetvalue(r, 0, 0), "t");
        PQclear(r);
        fputs(resume ? (changed ? "resumed " : "not paused: ")
                     : (changed ? "paused " : "already paused: "),
              stdout);
        out_display(stdout, argv[i]);
        putchar('\n');
    }
    return EXIT_OK;
}

int cmd_pause(tool *t, int argc, char **argv)
{
    return pause_or_resume(t, argc, argv, 0);
}

int cmd_resume(tool *t, int argc, char **argv)
{
    return pause_or_resume(t, argc, argv, 1);
}
