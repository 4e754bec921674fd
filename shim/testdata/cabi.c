// cabi.c calls every function of libddpshim.so through ddpshim.h, with good
// and bad arguments, and checks status codes and messages. Built and run by
// TestCABI; prints PASS on success, exits 1 with the failed check otherwise.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddpshim.h"

static int failures;

#define CHECK(cond, ...)                                              \
    do {                                                              \
        if (!(cond)) {                                                \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);      \
            fprintf(stderr, __VA_ARGS__);                             \
            fprintf(stderr, " (last error: %s)\n", ddpshim_last_error()); \
            failures++;                                               \
        }                                                             \
    } while (0)

// EXPECT checks a status code and, for errors, that a message was set.
#define EXPECT(call, want)                                                        \
    do {                                                                          \
        int rc_ = (call);                                                         \
        CHECK(rc_ == (want), "%s returned %d, want %d", #call, rc_, (want));      \
        if ((want) != DDPSHIM_OK)                                                 \
            CHECK(ddpshim_last_error()[0] != 0, "%s set no error message", #call); \
    } while (0)

struct rank_arg {
    int64_t comm;
    const char *peers;
    int rc;
};

static void *connect_rank(void *p) {
    struct rank_arg *a = p;
    a->rc = ddpshim_connect(a->comm, a->peers);
    return NULL;
}

static void bad_configs(void) {
    int64_t h = 0;
    EXPECT(ddpshim_open(NULL, &h), DDPSHIM_ERR_INVALID);
    EXPECT(ddpshim_open("{\"rank\":0,\"world_size\":1}", NULL), DDPSHIM_ERR_INVALID);
    EXPECT(ddpshim_open("{", &h), DDPSHIM_ERR_INVALID);
    EXPECT(ddpshim_open("{\"rank\":0}", &h), DDPSHIM_ERR_INVALID);
    EXPECT(ddpshim_open("{\"rank\":2,\"world_size\":2}", &h), DDPSHIM_ERR_INVALID);
    EXPECT(ddpshim_open("{\"rank\":0,\"world_size\":1,\"typo\":1}", &h), DDPSHIM_ERR_INVALID);
    EXPECT(ddpshim_open("{\"rank\":0,\"world_size\":1,\"transport\":\"carrier-pigeon\"}", &h), DDPSHIM_ERR_INVALID);
    EXPECT(ddpshim_open("{\"rank\":0,\"world_size\":1,\"bootstrap\":\"agent\"}", &h), DDPSHIM_ERR_INVALID);
    EXPECT(ddpshim_open("{\"rank\":0,\"world_size\":1,\"socket\":\"/nonexistent/ddp-agent.sock\",\"timeout_ms\":2000}", &h),
           DDPSHIM_ERR_UNAVAILABLE);
    CHECK(strstr(ddpshim_last_error(), "/nonexistent/ddp-agent.sock") != NULL, "message does not name the socket");
}

static void bad_handles(void) {
    int64_t w;
    int done;
    char buf[256];
    float x = 1;
    EXPECT(ddpshim_allreduce(424242, &x, 1, DDPSHIM_FLOAT32, DDPSHIM_SUM, NULL, 0, 0, &w), DDPSHIM_ERR_INVALID);
    EXPECT(ddpshim_work_wait(424242), DDPSHIM_ERR_INVALID);
    EXPECT(ddpshim_work_test(424242, &done), DDPSHIM_ERR_INVALID);
    EXPECT(ddpshim_work_free(424242), DDPSHIM_ERR_INVALID);
    EXPECT(ddpshim_abort(424242, NULL), DDPSHIM_ERR_INVALID);
    EXPECT(ddpshim_close(424242), DDPSHIM_ERR_INVALID);
    EXPECT(ddpshim_comm_info(424242, buf, sizeof buf), DDPSHIM_ERR_INVALID);
    EXPECT(ddpshim_bootstrap_info(424242, buf, sizeof buf), DDPSHIM_ERR_INVALID);
    EXPECT(ddpshim_connect(424242, "x"), DDPSHIM_ERR_INVALID);
    EXPECT(ddpshim_nccl_info(NULL, 0), DDPSHIM_ERR_INVALID);
    char nccl[4096];
    EXPECT(ddpshim_nccl_info(nccl, sizeof nccl), DDPSHIM_OK);
    if (strstr(nccl, "\"found\":") == NULL) {
        fprintf(stderr, "FAIL: ddpshim_nccl_info: %s\n", nccl);
        exit(1);
    }
    printf("nccl info: %s\n", nccl);
}

// one_rank drives a world of one through every call, then closes it.
static void one_rank(void) {
    int64_t h = 0, w = 0;
    char blob[1024], info[1024];
    int done = -1;
    float f[5] = {1, 2, 3, 4, 5};

    EXPECT(ddpshim_open("{\"rank\":0,\"world_size\":1,\"timeout_ms\":5000}", &h), DDPSHIM_OK);
    CHECK(h > 0, "handle %lld", (long long)h);
    EXPECT(ddpshim_allreduce(h, f, 5, DDPSHIM_FLOAT32, DDPSHIM_SUM, NULL, 0, 0, &w), DDPSHIM_ERR_INVALID); /* not connected */
    EXPECT(ddpshim_bootstrap_info(h, NULL, 10), DDPSHIM_ERR_INVALID);
    EXPECT(ddpshim_bootstrap_info(h, blob, 4), DDPSHIM_ERR_INVALID);
    CHECK(strstr(ddpshim_last_error(), "needed") != NULL, "too-small message does not give the size");
    EXPECT(ddpshim_bootstrap_info(h, blob, sizeof blob), DDPSHIM_OK);
    EXPECT(ddpshim_connect(h, NULL), DDPSHIM_ERR_INVALID);
    EXPECT(ddpshim_connect(h, "not json"), DDPSHIM_ERR_INVALID);
    EXPECT(ddpshim_connect(h, blob), DDPSHIM_OK);
    EXPECT(ddpshim_connect(h, blob), DDPSHIM_ERR_INVALID); /* already connected */

    EXPECT(ddpshim_allreduce(h, f, 5, DDPSHIM_FLOAT32, DDPSHIM_SUM, NULL, 0, 0, NULL), DDPSHIM_ERR_INVALID);
    EXPECT(ddpshim_allreduce(h, f, 5, 3, DDPSHIM_SUM, NULL, 0, 0, &w), DDPSHIM_ERR_INVALID);  /* uint32: unsupported */
    EXPECT(ddpshim_allreduce(h, f, 5, 99, DDPSHIM_SUM, NULL, 0, 0, &w), DDPSHIM_ERR_INVALID);
    EXPECT(ddpshim_allreduce(h, f, 5, DDPSHIM_FLOAT32, 1, NULL, 0, 0, &w), DDPSHIM_ERR_INVALID); /* prod */
    EXPECT(ddpshim_allreduce(h, f, -1, DDPSHIM_FLOAT32, DDPSHIM_SUM, NULL, 0, 0, &w), DDPSHIM_ERR_INVALID);
    EXPECT(ddpshim_allreduce(h, NULL, 5, DDPSHIM_FLOAT32, DDPSHIM_SUM, NULL, 0, 0, &w), DDPSHIM_ERR_INVALID);
    EXPECT(ddpshim_allreduce(h, f, 5, DDPSHIM_FLOAT32, DDPSHIM_SUM, (void *)0x1234, 0, 0, &w), DDPSHIM_ERR_INVALID);

    EXPECT(ddpshim_allreduce(h, NULL, 0, DDPSHIM_FLOAT32, DDPSHIM_SUM, NULL, 0, 0, &w), DDPSHIM_OK);
    EXPECT(ddpshim_work_wait(w), DDPSHIM_OK);
    EXPECT(ddpshim_work_free(w), DDPSHIM_OK);

    void *one[1] = {f}, *none[1] = {NULL};
    int64_t five[1] = {5}, minus[1] = {-1};
    EXPECT(ddpshim_broadcast(h, one, five, 1, DDPSHIM_FLOAT32, 1, 0, 0, &w), DDPSHIM_ERR_INVALID); /* no rank 1 */
    CHECK(strstr(ddpshim_last_error(), "root 1") != NULL, "bad root message: %s", ddpshim_last_error());
    EXPECT(ddpshim_broadcast(h, one, five, 1, DDPSHIM_FLOAT32, 0, 0, 0, NULL), DDPSHIM_ERR_INVALID);
    EXPECT(ddpshim_broadcast(h, one, five, 1, 99, 0, 0, 0, &w), DDPSHIM_ERR_INVALID);
    EXPECT(ddpshim_broadcast(h, none, five, 1, DDPSHIM_FLOAT32, 0, 0, 0, &w), DDPSHIM_ERR_INVALID);
    EXPECT(ddpshim_broadcast(h, one, minus, 1, DDPSHIM_FLOAT32, 0, 0, 0, &w), DDPSHIM_ERR_INVALID);
    EXPECT(ddpshim_broadcast(h, NULL, five, 1, DDPSHIM_FLOAT32, 0, 0, 0, &w), DDPSHIM_ERR_INVALID);
    EXPECT(ddpshim_broadcast(h, one, NULL, 1, DDPSHIM_FLOAT32, 0, 0, 0, &w), DDPSHIM_ERR_INVALID);
    EXPECT(ddpshim_broadcast(h, one, five, -1, DDPSHIM_FLOAT32, 0, 0, 0, &w), DDPSHIM_ERR_INVALID);

    EXPECT(ddpshim_allreduce(h, f, 5, DDPSHIM_FLOAT32, DDPSHIM_AVG, NULL, 7, 3, &w), DDPSHIM_OK);
    EXPECT(ddpshim_work_wait(w), DDPSHIM_OK);
    EXPECT(ddpshim_work_test(w, NULL), DDPSHIM_ERR_INVALID);
    EXPECT(ddpshim_work_test(w, &done), DDPSHIM_OK);
    CHECK(done == 1, "done = %d after wait", done);
    CHECK(f[0] == 1 && f[4] == 5, "a world of one changed the data: %g %g", f[0], f[4]);
    EXPECT(ddpshim_work_free(w), DDPSHIM_OK);
    EXPECT(ddpshim_work_free(w), DDPSHIM_ERR_INVALID);
    EXPECT(ddpshim_work_wait(w), DDPSHIM_ERR_INVALID);

    EXPECT(ddpshim_comm_info(h, NULL, 0), DDPSHIM_ERR_INVALID);
    EXPECT(ddpshim_comm_info(h, info, 3), DDPSHIM_ERR_INVALID);
    EXPECT(ddpshim_comm_info(h, info, sizeof info), DDPSHIM_OK);
    CHECK(strstr(info, "\"collectives\":2") != NULL, "comm_info: %s", info);
    EXPECT(ddpshim_broadcast(h, one, five, 1, DDPSHIM_FLOAT32, 0, 0, 0, &w), DDPSHIM_OK);
    EXPECT(ddpshim_work_wait(w), DDPSHIM_OK);
    EXPECT(ddpshim_work_free(w), DDPSHIM_OK);
    CHECK(f[0] == 1 && f[4] == 5, "a broadcast in a world of one changed the data: %g %g", f[0], f[4]);
    EXPECT(ddpshim_broadcast(h, NULL, NULL, 0, DDPSHIM_FLOAT32, 0, 0, 0, &w), DDPSHIM_OK); /* nothing: the ranks meet */
    EXPECT(ddpshim_work_wait(w), DDPSHIM_OK);
    EXPECT(ddpshim_work_free(w), DDPSHIM_OK);

    EXPECT(ddpshim_abort(h, "test abort"), DDPSHIM_OK);
    EXPECT(ddpshim_abort(h, NULL), DDPSHIM_OK); /* idempotent */
    EXPECT(ddpshim_allreduce(h, f, 5, DDPSHIM_FLOAT32, DDPSHIM_SUM, NULL, 0, 0, &w), DDPSHIM_ERR_ABORTED);
    CHECK(strstr(ddpshim_last_error(), "test abort") != NULL, "abort reason missing");
    EXPECT(ddpshim_close(h), DDPSHIM_OK);
    EXPECT(ddpshim_close(h), DDPSHIM_ERR_CLOSED);
    EXPECT(ddpshim_allreduce(h, f, 5, DDPSHIM_FLOAT32, DDPSHIM_SUM, NULL, 0, 0, &w), DDPSHIM_ERR_CLOSED);
    EXPECT(ddpshim_abort(h, NULL), DDPSHIM_ERR_CLOSED);
    EXPECT(ddpshim_comm_info(h, info, sizeof info), DDPSHIM_ERR_CLOSED);
    EXPECT(ddpshim_bootstrap_info(h, blob, sizeof blob), DDPSHIM_ERR_CLOSED);
    EXPECT(ddpshim_connect(h, blob), DDPSHIM_ERR_CLOSED);
}

// two_ranks runs a world of two inside this process: one thread per rank
// for the blocking connect, then all-reduces of every dtype.
static void two_ranks(const char *extra) {
    int64_t h[2];
    char cfg[256], blobs[2][1024], peers[2100];
    struct rank_arg a[2];
    pthread_t t[2];
    for (int r = 0; r < 2; r++) {
        snprintf(cfg, sizeof cfg, "{\"rank\":%d,\"world_size\":2,\"timeout_ms\":10000%s}", r, extra);
        EXPECT(ddpshim_open(cfg, &h[r]), DDPSHIM_OK);
        EXPECT(ddpshim_bootstrap_info(h[r], blobs[r], sizeof blobs[r]), DDPSHIM_OK);
    }
    snprintf(peers, sizeof peers, "%s\n%s", blobs[0], blobs[1]);
    for (int r = 0; r < 2; r++) {
        a[r] = (struct rank_arg){.comm = h[r], .peers = peers};
        pthread_create(&t[r], NULL, connect_rank, &a[r]);
    }
    for (int r = 0; r < 2; r++) {
        pthread_join(t[r], NULL);
        CHECK(a[r].rc == DDPSHIM_OK, "connect rank %d: %d", r, a[r].rc);
    }

    enum { N = 1001 };
    static float f32[2][N];
    static double f64[2][N];
    static int32_t i32[2][N];
    static int64_t i64[2][N];
    static uint16_t f16[2][N], bf16[2][N];
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < N; i++) {
            f32[r][i] = (float)(i + r);
            f64[r][i] = i * 0.5 + r;
            i32[r][i] = i - r;
            i64[r][i] = (int64_t)i << 33;
            f16[r][i] = 0x3c00;  /* 1.0 */
            bf16[r][i] = 0x3f80; /* 1.0 */
        }
    struct { void *buf[2]; int dtype, op; } cases[] = {
        {{f32[0], f32[1]}, DDPSHIM_FLOAT32, DDPSHIM_SUM},
        {{f64[0], f64[1]}, DDPSHIM_FLOAT64, DDPSHIM_AVG},
        {{i32[0], i32[1]}, DDPSHIM_INT32, DDPSHIM_SUM},
        {{i64[0], i64[1]}, DDPSHIM_INT64, DDPSHIM_SUM},
        {{f16[0], f16[1]}, DDPSHIM_FLOAT16, DDPSHIM_SUM},
        {{bf16[0], bf16[1]}, DDPSHIM_BFLOAT16, DDPSHIM_AVG},
    };
    int64_t w[2];
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        for (int r = 0; r < 2; r++)
            EXPECT(ddpshim_allreduce(h[r], cases[c].buf[r], N, cases[c].dtype, cases[c].op, NULL, 1, (int32_t)c, &w[r]), DDPSHIM_OK);
        for (int r = 0; r < 2; r++) {
            EXPECT(ddpshim_work_wait(w[r]), DDPSHIM_OK);
            EXPECT(ddpshim_work_free(w[r]), DDPSHIM_OK);
        }
    }
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < N; i++) {
            if (f32[r][i] != (float)(2 * i + 1) || f64[r][i] != i * 0.5 + 0.5 || i32[r][i] != 2 * i - 1 ||
                i64[r][i] != (int64_t)i << 34 || f16[r][i] != 0x4000 /* 2.0 */ || bf16[r][i] != 0x3f80 /* avg 1.0 */) {
                CHECK(0, "rank %d element %d wrong: %g %g %d %lld %#x %#x", r, i, f32[r][i], f64[r][i], i32[r][i],
                      (long long)i64[r][i], f16[r][i], bf16[r][i]);
                break;
            }
        }

    /* Broadcasts from each root, queued between all-reduces, the buffer
     * cut in two where each rank likes: every rank ends with the root's
     * bytes, and the all-reduce after them agrees. */
    int64_t wb[2];
    for (int root = 0; root < 2; root++) {
        for (int r = 0; r < 2; r++)
            for (int i = 0; i < N; i++) f64[r][i] = r * 1000.0 + i;
        for (int r = 0; r < 2; r++) {
            void *parts[2] = {f64[r], f64[r] + 100 + r};
            int64_t counts[2] = {100 + r, N - 100 - r};
            EXPECT(ddpshim_broadcast(h[r], parts, counts, 2, DDPSHIM_FLOAT64, root, 1, 7, &wb[r]), DDPSHIM_OK);
        }
        for (int r = 0; r < 2; r++)
            EXPECT(ddpshim_allreduce(h[r], f32[r], N, DDPSHIM_FLOAT32, DDPSHIM_SUM, NULL, 1, 8, &w[r]), DDPSHIM_OK);
        for (int r = 0; r < 2; r++) {
            EXPECT(ddpshim_work_wait(wb[r]), DDPSHIM_OK);
            EXPECT(ddpshim_work_wait(w[r]), DDPSHIM_OK);
            EXPECT(ddpshim_work_free(wb[r]), DDPSHIM_OK);
            EXPECT(ddpshim_work_free(w[r]), DDPSHIM_OK);
        }
        for (int r = 0; r < 2; r++)
            for (int i = 0; i < N; i++)
                if (f64[r][i] != root * 1000.0 + i) {
                    CHECK(0, "broadcast from %d: rank %d element %d is %g", root, r, i, f64[r][i]);
                    break;
                }
    }

    /* A count mismatch fails on both ranks instead of hanging. */
    for (int r = 0; r < 2; r++)
        EXPECT(ddpshim_allreduce(h[r], f32[r], N - r, DDPSHIM_FLOAT32, DDPSHIM_SUM, NULL, 2, 0, &w[r]), DDPSHIM_OK);
    for (int r = 0; r < 2; r++) {
        int rc = ddpshim_work_wait(w[r]);
        CHECK(rc == DDPSHIM_ERR_MISMATCH || rc == DDPSHIM_ERR_PEER || rc == DDPSHIM_ERR_ABORTED,
              "rank %d: count mismatch gave %d", r, rc);
        EXPECT(ddpshim_work_free(w[r]), DDPSHIM_OK);
    }
    char info[512];
    EXPECT(ddpshim_comm_info(h[0], info, sizeof info), DDPSHIM_OK);
    printf("two ranks%s: %s\n", extra, info);
    for (int r = 0; r < 2; r++) EXPECT(ddpshim_close(h[r]), DDPSHIM_OK);
}

int main(void) {
    CHECK(strstr(ddpshim_version(), "abi 1") != NULL, "version %s", ddpshim_version());
    CHECK(ddpshim_last_error()[0] == 0, "fresh thread has an error message");
    bad_configs();
    bad_handles();
    one_rank();
    two_ranks("");
    two_ranks(",\"shm\":false");
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("PASS\n");
    return 0;
}
