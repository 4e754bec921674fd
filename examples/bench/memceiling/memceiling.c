/*
 * memceiling: the memory-bandwidth ceiling of an n-rank all-reduce on this
 * host, as busbw, so that an all-reduce's busbw can be put against it.
 *
 * What "ceiling" means here. An in-place all-reduce of S bytes must, on
 * every rank, at least read the rank's S input bytes and write S result
 * bytes, all n ranks at once; whatever else an implementation moves (staging
 * copies through shared memory, a peer's data) only adds traffic. So the
 * time t in which n processes, each touching only its own S-byte buffers,
 * can concurrently read S bytes and write S bytes is a lower bound on the
 * all-reduce's time once S is well past the caches, and
 *
 *     ceiling busbw = 2(n-1)/n * S / t
 *
 * (the nccl-tests busbw of an all-reduce that took t) is an upper bound on
 * the busbw any implementation reaches at that size. Two ways of reading S
 * and writing S are timed, and the faster one is the ceiling:
 *   rmw:  buf[i] += 1 in place (reads S, writes the same S back);
 *   copy: dst = src, memcpy (reads S, writes S elsewhere; with write-allocate
 *         caches this also reads dst, which is why rmw is usually faster).
 * The bound ignores that real ranks also exchange data, so no
 * implementation reaches it; the goal is 90 % of it.
 *
 * A repetition: n forked processes fault their buffers in, meet at a
 * spinning barrier in shared memory, each times its own pass with
 * CLOCK_MONOTONIC, and t is the last end minus the first start. The output
 * is one JSON object per (size, mode) line, with every repetition's busbw,
 * their median, min and max, for a driver to parse.
 *
 * Build: gcc -O2 -o memceiling memceiling.c (plain -O2: portable).
 * Usage: memceiling [-n ranks] [-r reps] [size_MiB ...] (default 2, 7, 64 256)
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_RANKS 64
#define MAX_REPS 100

struct shared {
    atomic_int ready; /* ranks at the barrier */
    atomic_int go;
    double start[MAX_RANKS], end[MAX_RANKS];
};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* pass does one read-S-write-S pass; volatile-free, but the result lands in
 * memory the parent never reads, so it must not be optimised away: the
 * buffers come from mmap and the loop stores through them. */
static void pass(int mode, float *a, float *b, size_t n) {
    if (mode == 0) {
        for (size_t i = 0; i < n; i++)
            a[i] += 1.0f;
    } else {
        memcpy(b, a, n * sizeof(float));
    }
}

/* rank is one child: fault in, barrier, time one pass, exit. */
static void rank(struct shared *sh, int r, int world, int mode, size_t bytes) {
    float *a = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    float *b = mode ? mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) : NULL;
    if (a == MAP_FAILED || b == MAP_FAILED) {
        perror("mmap");
        _exit(1);
    }
    memset(a, 1, bytes); /* fault in, and evict the other rank's data from the caches */
    if (b)
        memset(b, 2, bytes);
    atomic_fetch_add(&sh->ready, 1);
    while (atomic_load(&sh->ready) < world)
        ;
    if (r == 0)
        atomic_store(&sh->go, 1);
    while (!atomic_load(&sh->go))
        ;
    sh->start[r] = now();
    pass(mode, a, b, bytes / sizeof(float));
    sh->end[r] = now();
    _exit(0);
}

/* once runs one repetition and returns its busbw in GB/s (0 on failure). */
static double once(struct shared *sh, int world, int mode, size_t bytes) {
    memset(sh, 0, sizeof *sh);
    for (int r = 0; r < world; r++) {
        pid_t p = fork();
        if (p < 0) {
            perror("fork");
            return 0;
        }
        if (p == 0)
            rank(sh, r, world, mode, bytes);
    }
    int ok = 1, st;
    for (int r = 0; r < world; r++)
        if (wait(&st) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            ok = 0;
    if (!ok)
        return 0;
    double t0 = sh->start[0], t1 = sh->end[0];
    for (int r = 1; r < world; r++) {
        if (sh->start[r] < t0)
            t0 = sh->start[r];
        if (sh->end[r] > t1)
            t1 = sh->end[r];
    }
    return 2.0 * (world - 1) / world * (double)bytes / (t1 - t0) / 1e9;
}

static int cmp(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

int main(int argc, char **argv) {
    int world = 2, reps = 7, opt;
    while ((opt = getopt(argc, argv, "n:r:")) != -1) {
        if (opt == 'n')
            world = atoi(optarg);
        else if (opt == 'r')
            reps = atoi(optarg);
        else {
            fprintf(stderr, "usage: %s [-n ranks] [-r reps] [size_MiB ...]\n", argv[0]);
            return 2;
        }
    }
    if (world < 2 || world > MAX_RANKS || reps < 1 || reps > MAX_REPS) {
        fprintf(stderr, "memceiling: ranks must be 2..%d, reps 1..%d\n", MAX_RANKS, MAX_REPS);
        return 2;
    }
    size_t def[] = {64, 256}, *sizes = def;
    int nsizes = 2;
    if (optind < argc) {
        nsizes = argc - optind;
        sizes = calloc(nsizes, sizeof *sizes);
        for (int i = 0; i < nsizes; i++)
            sizes[i] = strtoul(argv[optind + i], NULL, 10);
    }
    struct shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    static const char *modes[] = {"rmw", "copy"};
    for (int s = 0; s < nsizes; s++) {
        size_t bytes = sizes[s] << 20;
        double bw[2][MAX_REPS];
        for (int i = 0; i < reps; i++) /* the modes alternate, so drift hits both */
            for (int m = 0; m < 2; m++)
                if ((bw[m][i] = once(sh, world, m, bytes)) == 0)
                    return 1;
        for (int m = 0; m < 2; m++) {
            printf("{\"ranks\": %d, \"bytes\": %zu, \"mode\": \"%s\", \"busbw\": [", world, bytes, modes[m]);
            for (int i = 0; i < reps; i++)
                printf("%s%.3f", i ? ", " : "", bw[m][i]);
            qsort(bw[m], reps, sizeof(double), cmp);
            printf("], \"median\": %.3f, \"min\": %.3f, \"max\": %.3f}\n", bw[m][reps / 2], bw[m][0], bw[m][reps - 1]);
        }
        fflush(stdout);
    }
    return 0;
}
