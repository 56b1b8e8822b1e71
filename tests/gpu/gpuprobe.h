// gpuprobe.h - whether a GPU is usable, asked in a throwaway child process (GPU tests that fork).
#ifndef MARLAAS_GPUPROBE_H
#define MARLAAS_GPUPROBE_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/cuda/cuda.h"

// CUDA does not survive fork(): a test that forks ranks must not initialise CUDA before it forks. A
// throwaway child answers whether a GPU is usable (1, or 0 with the reason in why) and how many
// there are (*n_gpus).
static inline int gpu_probe(int *n_gpus, char *why, size_t n) {
    int fd[2];
    if (pipe(fd)) return 0;
    pid_t p = fork();
    if (p == 0) {
        char buf[600];
        int ok = kernels_cuda_available(buf + 8, sizeof buf - 8), cnt = 0;
        if (ok) cnt = kernels_cuda_devices();
        snprintf(buf, 8, "%d %3d", ok, cnt);
        buf[7] = ' ';
        ssize_t w = write(fd[1], buf, sizeof buf);
        (void)w;
        _exit(0);
    }
    close(fd[1]);
    char buf[600] = "";
    size_t got = 0;
    ssize_t r;
    while (got < sizeof buf && (r = read(fd[0], buf + got, sizeof buf - got)) > 0) got += (size_t)r;
    close(fd[0]);
    waitpid(p, NULL, 0);
    if (got < 8) {
        snprintf(why, n, "the GPU probe process died");
        return 0;
    }
    buf[sizeof buf - 1] = 0;
    *n_gpus = atoi(buf + 2);
    snprintf(why, n, "%.400s", buf + 8);
    return buf[0] == '1';
}

#endif
