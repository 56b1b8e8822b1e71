// testbits.h - small helpers shared by unit and GPU tests that need neither the engine nor a
// model: float bit patterns, and a free loopback port.
#ifndef MARLAAS_TESTBITS_H
#define MARLAAS_TESTBITS_H

#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static inline uint32_t tu_f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float tu_u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

// A loopback port nothing listens on right now (the kernel's choice for an ephemeral bind).
static inline int tu_free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0, "socket: %s", strerror(errno));
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0;
    close(fd);
    cr_assert(ok, "cannot pick a free port: %s", strerror(errno));
    return ntohs(a.sin_port);
}

#endif
