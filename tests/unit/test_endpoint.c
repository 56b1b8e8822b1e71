// test_endpoint.c - which endpoints a tenant may make the cluster connect to (common/net/
// endpoint.c): the syntax check with its tricks, allow-lists of CIDRs, names and ports, deny
// rules of the cluster's own ports, each refusal naming its reason or rule, and the rules a
// service builds from its settings (svc_endpoint_rules).
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common/net/endpoint.h"
#include "common/svc/svc.h"
#include "common/util/util.h"

typedef struct {
    const char *ep;
    bool ok;
    const char *why;   // a piece of the refusal (NULL: accepted, or any reason)
} ep_case_t;

static void run_table(const endpoint_rules_t *r, const ep_case_t *c, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++) {
        char err[ERR_LEN] = "";
        bool ok = endpoint_allowed(c[i].ep, r, err);
        cr_expect_eq(ok, c[i].ok, "%s: '%s' %s (%s)", what, c[i].ep, ok ? "accepted" : "refused", err);
        if (!ok && c[i].why) cr_expect(strstr(err, c[i].why), "%s: '%s' refused with '%s', want '%s'", what, c[i].ep, err, c[i].why);
    }
}

// No allow-list, no deny rules: any well-formed tcp endpoint; the syntax tricks are refused.
Test(endpoint, syntax_without_rules) {
    char long_host[300], long_ep[320], label64[100];
    memset(long_host, 'a', 260), long_host[260] = 0;
    snprintf(long_ep, sizeof long_ep, "tcp://%s:9100", long_host);
    memset(label64, 'b', 64), label64[64] = 0;
    char ep64[200];
    snprintf(ep64, sizeof ep64, "tcp://%s.example.com:9100", label64);
    const ep_case_t cases[] = {
        {"tcp://reward-svc:9100", true, NULL},
        {"tcp://Reward-SVC.Example.COM:9100", true, NULL},
        {"tcp://reward-svc.:9100", true, NULL},
        {"tcp://10.1.2.3:1", true, NULL},
        {"tcp://10.1.2.3:65535", true, NULL},
        {"tcp://[::1]:9100", true, NULL},
        {"tcp://[fd00::1:2]:9100", true, NULL},
        {"tcp://under_score:9100", true, NULL},
        {"", false, "empty"},
        {"tcp://", false, "no port"},
        {"tcp://host", false, "no port"},
        {"tcp://host:", false, "port"},
        {"tcp://host:0", false, "port '0'"},
        {"tcp://host:65536", false, "1..65535"},
        {"tcp://host:99999999999", false, "1..65535"},
        {"tcp://host:-1", false, "1..65535"},
        {"tcp://host:+80", false, "1..65535"},
        {"tcp://host:080", false, "1..65535"},
        {"tcp://host:80x", false, "1..65535"},
        {"tcp://host:*", false, "1..65535"},
        {"tcp://*:5555", false, "bind address"},
        {"tcp://*.example.com:5555", false, "bind address"},
        {"tcp://0.0.0.0:5555", false, "unspecified"},
        {"tcp://[::]:5555", false, "unspecified"},
        {"tcp://[::ffff:0.0.0.0]:5555", false, "unspecified"},
        {"tcp://user@host:5555", false, "userinfo"},
        {"tcp://user:pw@host:5555", false, "userinfo"},
        {"tcp://10.0.0.1;127.0.0.1:6379", false, "source-address"},
        {"tcp://eth0;host:5555", false, "source-address"},
        {"tcp://a:1,tcp://127.0.0.1:6379", false, "list"},
        {" tcp://host:5555", false, "blank"},
        {"tcp://host:5555 ", false, "blank"},
        {"tcp://ho st:5555", false, "blank"},
        {"tcp://host:5555\n", false, "control"},
        {"tcp://h\tst:5555", false, "control"},
        {"tcp://h\xc3\xa9st:5555", false, "non-ASCII"},
        {"TCP://host:5555", false, "lower case"},
        {"Tcp://host:5555", false, "transport"},
        {"udp://host:5555", false, "transport 'udp'"},
        {"ws://host:5555", false, "transport"},
        {"pgm://eth0;239.192.1.1:5555", false, "transport"},
        {"inproc://zeromq.zap.01", false, "inproc"},
        {"inproc://x", false, "never"},
        {"host:5555", false, "not a ZeroMQ endpoint"},
        {"tcp://host/path:5555", false, "no path"},
        {"tcp://host:5555/x", false, "no path"},
        {"tcp://host:5555?x=1", false, "no path"},
        {"tcp://::1:5555", false, "brackets"},
        {"tcp://[::1:5555", false, "without ']'"},
        {"tcp://[::1]", false, "no port"},
        {"tcp://[::1]x:5555", false, "brackets"},
        {"tcp://[fe80::1%eth0]:5555", false, "zone"},
        {"tcp://[not-v6]:5555", false, "IPv6"},
        {"tcp://[]:5555", false, "IPv6"},
        {"tcp://127.1:6379", false, "dotted-quad"},
        {"tcp://2130706433:6379", false, "dotted-quad"},
        {"tcp://0x7f.0.0.1:6379", false, "dotted-quad"},
        {"tcp://0x7f000001:6379", false, "dotted-quad"},
        {"tcp://0177.0.0.1:6379", false, "dotted-quad"},
        {"tcp://10.0.0.256:9100", false, "dotted-quad"},
        {"tcp://1.2.3.4.5:9100", false, "dotted-quad"},
        {"tcp://a..b:9100", false, "empty label"},
        {"tcp://.a:9100", false, "empty label"},
        {"tcp://a..:9100", false, "empty label"},
        {"tcp://.:9100", false, "empty host"},
        {"tcp://:9100", false, "empty host"},
        {"tcp://ho$t:9100", false, "character '$'"},
        {"tcp://ho%74:9100", false, "character '%'"},
        {ep64, false, "63 bytes"},
        {long_ep, false, "longer than 255"},
        {"ipc:///tmp/reward.sock", false, "allow-list"},
        {"ipc://", false, "path"},
    };
    run_table(NULL, cases, sizeof cases / sizeof cases[0], "no rules");
    // the parsed form: a name lower-cased without its trailing dot, a mapped IPv6 address as IPv4
    endpoint_t e;
    char err[ERR_LEN];
    cr_assert_eq(endpoint_parse("tcp://Rewards.Example.COM.:9100", &e, err), 0, "%s", err);
    cr_expect_str_eq(e.host, "rewards.example.com");
    cr_expect_eq(e.family, 0);
    cr_expect_eq(e.port, 9100);
    cr_assert_eq(endpoint_parse("tcp://[::ffff:10.1.2.3]:80", &e, err), 0, "%s", err);
    cr_expect_eq(e.family, AF_INET);
    cr_expect(e.addr[0] == 10 && e.addr[1] == 1 && e.addr[2] == 2 && e.addr[3] == 3);
    cr_assert_eq(endpoint_parse("ipc:///run/r.sock", &e, err), 0, "%s", err);
    cr_expect_eq(e.kind, ENDPOINT_IPC);
    cr_expect_str_eq(e.path, "/run/r.sock");
}

// Deny rules hold on every host name the cluster answers to, with or without an allow-list.
Test(endpoint, deny_cluster_ports) {
    char err[ERR_LEN];
    endpoint_rules_t *r = endpoint_rules_new(NULL, err);
    cr_assert_not_null(r, "%s", err);
    cr_assert_eq(endpoint_rules_deny(r, "6379", "the cluster's Redis (--redis)", err), 0, "%s", err);
    cr_assert_eq(endpoint_rules_deny(r, "tcp://*:7000", "the scheduler's API (--api)", err), 0, "%s", err);
    cr_assert_eq(endpoint_rules_deny(r, "tcp://127.0.0.1:7003", "the scheduler's report port (--reports)", err), 0, "%s", err);
    cr_assert_eq(endpoint_rules_deny(r, "tcp://v1:7010, tcp://[::1]:7011", "a verifier (--verifiers)", err), 0, "%s", err);
    cr_assert_eq(endpoint_rules_deny(r, "redis.internal:6380", "a second Redis", err), 0, "%s", err);
    cr_assert_eq(endpoint_rules_deny(r, "ipc:///run/marlaas/work", "the work socket", err), 0, "%s", err);
    cr_assert_eq(endpoint_rules_deny(r, "inproc://x", "ignored", err), 0, "%s", err);
    cr_expect_eq(endpoint_rules_deny(r, "tcp://redis", "Redis", err), -1);
    cr_expect(strstr(err, "names no port"), "%s", err);
    const ep_case_t cases[] = {
        {"tcp://127.0.0.1:6379", false, "port 6379 is the cluster's Redis (--redis)"},
        {"tcp://localhost:6379", false, "Redis"},
        {"tcp://LOCALHOST.:6379", false, "Redis"},
        {"tcp://[::1]:6379", false, "Redis"},
        {"tcp://[::ffff:127.0.0.1]:6379", false, "Redis"},
        {"tcp://10.9.8.7:6379", false, "Redis"},
        {"tcp://scheduler:7003", false, "report port (--reports)"},
        {"tcp://scheduler:7000", false, "API"},
        {"tcp://v2:7011", false, "verifier"},
        {"tcp://x:6380", false, "second Redis"},
        {"tcp://127.0.0.1:6378", true, NULL},
        {"tcp://rewards:7004", true, NULL},
        {"ipc:///run/marlaas/work", false, "the work socket"},
    };
    run_table(r, cases, sizeof cases / sizeof cases[0], "deny");
    char desc[512];
    endpoint_rules_describe(r, desc, sizeof desc);
    cr_expect(strstr(desc, "no allow-list"), "%s", desc);
    cr_expect(strstr(desc, "6379 7000 7003 7010 7011 6380 ipc:///run/marlaas/work"), "%s", desc);
    endpoint_rules_destroy(&r);
    cr_expect_null(r);
    endpoint_rules_destroy(&r);   // accepts NULL
}

Test(endpoint, allow_list) {
    char err[ERR_LEN];
    endpoint_rules_t *r = endpoint_rules_new(" 10.0.0.0/8, 192.168.4.7:9100-9199 ,fd00::/8,[2001:db8::1]:9300,"
                                             "[2001:db8:1::]/48:9400 , reward-svc, *.Rewards.Example.com.:9100,"
                                             "tcp://172.16.0.0/12:9500, ipc:///run/rewards/*,ipc:///tmp/one.sock,"
                                             "::ffff:100.64.0.0/106",
                                             err);
    cr_assert_not_null(r, "%s", err);
    cr_assert_eq(endpoint_rules_deny(r, "6379", "the cluster's Redis (--redis)", err), 0, "%s", err);
    const ep_case_t cases[] = {
        {"tcp://10.1.2.3:9100", true, NULL},
        {"tcp://10.255.255.255:1", true, NULL},
        {"tcp://10.1.2.3:6379", false, "Redis"},   // deny wins over the allow-list
        {"tcp://11.0.0.1:9100", false, "host 11.0.0.1 matches no entry"},
        {"tcp://9.255.255.255:9100", false, "matches no entry"},
        {"tcp://[::ffff:10.0.0.9]:9100", true, NULL},   // mapped: checked as IPv4
        {"tcp://192.168.4.7:9150", true, NULL},
        {"tcp://192.168.4.7:9199", true, NULL},
        {"tcp://192.168.4.7:9200", false, "outside the ports of allow-list entry '192.168.4.7:9100-9199'"},
        {"tcp://192.168.4.8:9150", false, "matches no entry"},
        {"tcp://[fd12:3456::1]:5000", true, NULL},
        {"tcp://[FD00::ABCD]:5000", true, NULL},
        {"tcp://[fe00::1]:5000", false, "matches no entry"},
        {"tcp://[2001:db8::1]:9300", true, NULL},
        {"tcp://[2001:db8::1]:9301", false, "outside the ports"},
        {"tcp://[2001:db8::2]:9300", false, "matches no entry"},
        {"tcp://[2001:db8:1:ffff::5]:9400", true, NULL},
        {"tcp://[2001:db8:2::5]:9400", false, "matches no entry"},
        {"tcp://reward-svc:1234", true, NULL},
        {"tcp://REWARD-SVC.:1234", true, NULL},
        {"tcp://reward-svc.evil.com:1234", false, "matches no entry"},
        {"tcp://xreward-svc:1234", false, "matches no entry"},
        {"tcp://a.rewards.example.com:9100", true, NULL},
        {"tcp://a.b.REWARDS.example.com.:9100", true, NULL},
        {"tcp://rewards.example.com:9100", false, "matches no entry"},   // the domain itself is not below it
        {"tcp://evilrewards.example.com:9100", false, "matches no entry"},
        {"tcp://a.rewards.example.com.evil.net:9100", false, "matches no entry"},
        {"tcp://a.rewards.example.com:9101", false, "outside the ports of allow-list entry '*.Rewards.Example.com.:9100'"},
        {"tcp://172.31.0.1:9500", true, NULL},
        {"tcp://172.32.0.1:9500", false, "matches no entry"},
        {"tcp://100.64.1.1:80", true, NULL},
        {"tcp://100.128.0.1:80", false, "matches no entry"},
        {"tcp://10.1:9100", false, "dotted-quad"},   // not a name that could match anything
        {"ipc:///run/rewards/a.sock", true, NULL},
        {"ipc:///run/rewardsX", false, "matches no entry"},
        {"ipc:///tmp/one.sock", true, NULL},
        {"ipc:///tmp/one.sock2", false, "matches no entry"},
        {"inproc://x", false, "inproc"},
        {"tcp://*:9100", false, "bind address"},
    };
    run_table(r, cases, sizeof cases / sizeof cases[0], "allow-list");
    endpoint_rules_destroy(&r);

    // a name in the list matches names only; an address entry matches addresses only
    r = endpoint_rules_new("localhost", err);
    cr_assert_not_null(r, "%s", err);
    const ep_case_t names[] = {
        {"tcp://localhost:9100", true, NULL},
        {"tcp://127.0.0.1:9100", false, "matches no entry"},
        {"ipc:///tmp/x", false, "matches no entry"},
    };
    run_table(r, names, sizeof names / sizeof names[0], "names");
    endpoint_rules_destroy(&r);

    // "*" with a port range: any host, those ports
    r = endpoint_rules_new("*:9100-9199", err);
    cr_assert_not_null(r, "%s", err);
    const ep_case_t any[] = {
        {"tcp://anything:9100", true, NULL},
        {"tcp://[::1]:9199", true, NULL},
        {"tcp://anything:9200", false, "outside the ports of allow-list entry '*:9100-9199'"},
    };
    run_table(r, any, sizeof any / sizeof any[0], "any");
    endpoint_rules_destroy(&r);

    // a blank list is no list
    r = endpoint_rules_new("  \t ", err);
    cr_assert_not_null(r, "%s", err);
    cr_expect(endpoint_allowed("tcp://anywhere:1", r, err), "%s", err);
    endpoint_rules_destroy(&r);
}

Test(endpoint, bad_allow_lists) {
    static const struct {
        const char *list, *why;
    } cases[] = {
        {"10.0.0.0/8,", "entry 2 is empty"},
        {"a,,b", "entry 2 is empty"},
        {"10.0.0.1/8", "host bits"},
        {"10.0.0.0/33", "more than 32"},
        {"10.0.0.0/", "prefix length"},
        {"10.0.0.0/x", "prefix length"},
        {"fd00::/129", "more than 128"},
        {"fd00::1/8", "host bits"},
        {"::ffff:10.0.0.0/90", "at least 96"},
        {"[fd00::1", "without ']'"},
        {"[fd00::1]x", "after ']'"},
        {"[fd00::1%eth0]", "zone"},
        {"10.0.0.0/8:0", "bad port"},
        {"host:70000", "bad port"},
        {"host:9200-9100", "bad port"},
        {"host:", "bad port"},
        {"host:a-b", "bad port"},
        {"a.*.example.com", "only as the whole host"},
        {"*example.com", "only as the whole host"},
        {"**", "only as the whole host"},
        {"127.1", "dotted-quad"},
        {"ho st", "blank"},
        {"udp://10.0.0.0/8", "only tcp:// and ipc://"},
        {"ipc://", "needs a path"},
        {":9100", "no host"},
        {"a..b", "empty label"},
        {"bad$name", "character '$'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[ERR_LEN] = "";
        endpoint_rules_t *r = endpoint_rules_new(cases[i].list, err);
        cr_expect_null(r, "'%s' accepted", cases[i].list);
        endpoint_rules_destroy(&r);
        cr_expect(strstr(err, cases[i].why), "'%s': error '%s', want '%s'", cases[i].list, err, cases[i].why);
    }
    // an overlong entry
    char big[400] = "a";
    memset(big, 'a', 300), big[300] = 0;
    char err[ERR_LEN];
    cr_expect_null(endpoint_rules_new(big, err));
    cr_expect(strstr(err, "longer than"), "%s", err);
}

// The rules a service builds from its settings (svc_endpoint_rules): reward_allow from --set,
// else the environment; the cluster's own ports from the endpoint settings and Redis.
Test(endpoint, from_service_settings) {
    svc_t s;
    char *argv[] = {"marlaas-verifier", "--insecure", "--redis", "10.0.0.5:6390", "--reports", "tcp://scheduler:7103",
                    "--set", "reward_allow=10.0.0.0/8, *.rewards.example.com", "--set", "dp_endpoint=tcp://t0:7040", NULL};
    cr_assert_eq(svc_init(&s, "verifier", 10, argv, ""), 0);
    char err[ERR_LEN];
    endpoint_rules_t *r = svc_endpoint_rules(&s, err);
    cr_assert_not_null(r, "%s", err);
    const ep_case_t cases[] = {
        {"tcp://10.1.2.3:9100", true, NULL},
        {"tcp://a.rewards.example.com:9100", true, NULL},
        {"tcp://11.1.2.3:9100", false, "allow-list"},
        {"tcp://10.0.0.5:6390", false, "Redis (--redis)"},
        {"tcp://10.0.0.9:7103", false, "report port (--reports)"},
        {"tcp://10.0.0.9:7000", false, "API (--api)"},
        {"tcp://10.0.0.9:7001", false, "work port (--work)"},
        {"tcp://10.0.0.9:7010", false, "verifier"},
        {"tcp://10.0.0.9:7020", false, "trainer"},
        {"tcp://10.0.0.9:7021", false, "trainer's event port"},
        {"tcp://10.0.0.9:7040", false, "dp_endpoint"},
    };
    run_table(r, cases, sizeof cases / sizeof cases[0], "svc");
    endpoint_rules_destroy(&r);

    // the environment when no --set names it; a bad list names the setting
    setenv("MARLAAS_REWARD_ALLOW", "10.0.0.0/33", 1);
    char *argv2[] = {"marlaas-verifier", "--insecure", NULL};
    cr_assert_eq(svc_init(&s, "verifier", 2, argv2, ""), 0);
    cr_expect_null(svc_endpoint_rules(&s, err));
    cr_expect(strstr(err, "reward_allow: allow-list entry 1 '10.0.0.0/33'"), "%s", err);
    unsetenv("MARLAAS_REWARD_ALLOW");

    // a --set value that does not fit is refused, not cut (an allow-list losing entries)
    char big[400];
    memset(big, 'a', sizeof big);
    memcpy(big, "reward_allow=", 13);
    big[sizeof big - 1] = 0;
    char *argv3[] = {"marlaas-verifier", "--insecure", "--set", big, NULL};
    cr_expect_eq(svc_init(&s, "verifier", 4, argv3, ""), -1);
}
