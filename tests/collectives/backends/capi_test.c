/* A small C program over the engine's C interface (ndist_engine.h; docs/native.md, "The C
 * interface"): every function of the table once on exactly computable data, the results checked
 * here, the error statuses of bad arguments, and a handle that is none. It runs in a thread of
 * its own (``capi_selftest_thread``: a thread Python never saw, holding no GIL), as a torch
 * backend's worker would call.
 *
 * Built by tests/collectives/backends/test_native_capi.py with the system C compiler into a
 * shared library (the rank body passes the table, from the capsule, and the group's handle);
 * with -DCAPI_TEST_MAIN it is also a program that embeds CPython, sets a group up through
 * ndist and runs the same test (``main`` below). ``capi_calls_*`` (below) make calls from a thread
 * while the test's Python thread holds the GIL. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ndist_engine.h"

typedef struct {
    const ndist_engine_api *api;
    ndist_group g;
    char why[1400];
} Job;

#define FAIL(...)                                        \
    do {                                                 \
        snprintf(j->why, sizeof j->why, __VA_ARGS__);    \
        goto fail;                                       \
    } while (0)

/* a call that must succeed */
#define OK(expr)                                                                                          \
    do {                                                                                                  \
        memset(&e, 0, sizeof e);                                                                          \
        int s_ = (expr);                                                                                  \
        if (s_ != NDIST_OK)                                                                               \
            FAIL("line %d: %s: status %d (%s): %s", __LINE__, #expr, s_, e.type, e.message);             \
    } while (0)

/* a call that must return ``want``, the group still usable */
#define REFUSED(want, expr)                                                                               \
    do {                                                                                                  \
        memset(&e, 0, sizeof e);                                                                          \
        int s_ = (expr);                                                                                  \
        if (s_ != (want) || e.status != (want) || (want == NDIST_E_ARGUMENT && !e.usable) || !e.message[0]) \
            FAIL("line %d: %s: expected status %d, got %d (%s, usable %d): %s", __LINE__, #expr, want, s_, \
                 e.type, e.usable, e.message);                                                            \
    } while (0)

#define CHECK(cond, ...)       \
    do {                       \
        if (!(cond))           \
            FAIL(__VA_ARGS__); \
    } while (0)

static int selftest(Job *j)
{
    const ndist_engine_api *api = j->api;
    ndist_group g = j->g;
    ndist_error e;
    int r = -1, n = -1;
    int64_t *i64 = NULL;
    double *f64 = NULL, *f64b = NULL;
    float *f32 = NULL;
    int32_t *i32 = NULL, *i32b = NULL;
    uint8_t *u8 = NULL, *u8b = NULL;

    CHECK(api->version == NDIST_ENGINE_API_VERSION && api->size >= sizeof(ndist_engine_api),
          "table version %u size %u, expected %d and at least %zu", api->version, api->size,
          NDIST_ENGINE_API_VERSION, sizeof(ndist_engine_api));
    OK(api->group_info(g, &r, &n, &e));
    CHECK(n >= 1 && r >= 0 && r < n, "group_info: rank %d size %d", r, n);

    /* all_reduce: int64 SUM, float64 MAX, float32 AVG; and one above 256 KiB (reduce-scatter +
     * all-gather through the slots) */
    size_t c = 1000, big = 100000;
    i64 = malloc(c * sizeof *i64);
    f64 = malloc(big * sizeof *f64);
    f32 = malloc(c * sizeof *f32);
    CHECK(i64 && f64 && f32, "out of memory");
    for (size_t i = 0; i < c; i++)
        i64[i] = (int64_t)r * 1000 + (int64_t)i;
    OK(api->all_reduce(g, i64, c, NDIST_INT64, NDIST_SUM, &e));
    for (size_t i = 0; i < c; i++)
        CHECK(i64[i] == 1000LL * n * (n - 1) / 2 + (int64_t)n * (int64_t)i, "all_reduce SUM [%zu] = %lld", i,
              (long long)i64[i]);
    for (size_t i = 0; i < c; i++)
        f64[i] = r + (double)i;
    OK(api->all_reduce(g, f64, c, NDIST_FLOAT64, NDIST_MAX, &e));
    for (size_t i = 0; i < c; i++)
        CHECK(f64[i] == n - 1 + (double)i, "all_reduce MAX [%zu] = %g", i, f64[i]);
    for (size_t i = 0; i < c; i++)
        f32[i] = 2.0f * (float)(r + 1);
    OK(api->all_reduce(g, f32, c, NDIST_FLOAT32, NDIST_AVG, &e));
    for (size_t i = 0; i < c; i++)
        CHECK(f32[i] == (float)(n + 1), "all_reduce AVG [%zu] = %g, expected %d", i, f32[i], n + 1);
    for (size_t i = 0; i < big; i++)
        f64[i] = r + (double)(i % 10);
    OK(api->all_reduce(g, f64, big, NDIST_FLOAT64, NDIST_SUM, &e));
    for (size_t i = 0; i < big; i++)
        CHECK(f64[i] == n * (n - 1) / 2.0 + n * (double)(i % 10), "all_reduce large [%zu] = %g", i, f64[i]);

    /* broadcast from the last rank */
    i32 = calloc(777, sizeof *i32);
    CHECK(i32, "out of memory");
    if (r == n - 1)
        for (int i = 0; i < 777; i++)
            i32[i] = 3 * i + 7;
    OK(api->broadcast(g, i32, 777, NDIST_INT32, n - 1, &e));
    for (int i = 0; i < 777; i++)
        CHECK(i32[i] == 3 * i + 7, "broadcast [%d] = %d", i, i32[i]);

    /* all_gather, then in place (in = this rank's block of out) */
    f64b = malloc((size_t)n * 100 * sizeof *f64b);
    CHECK(f64b, "out of memory");
    for (int i = 0; i < 100; i++)
        f64[i] = r * 100.0 + i;
    OK(api->all_gather(g, f64b, f64, 100, NDIST_FLOAT64, &e));
    for (int i = 0; i < n * 100; i++)
        CHECK(f64b[i] == (double)i, "all_gather [%d] = %g", i, f64b[i]);
    for (int i = 0; i < n * 100; i++)
        f64b[i] = i / 100 == r ? (double)-i : 0.0;
    OK(api->all_gather(g, f64b, f64b + (size_t)r * 100, 100, NDIST_FLOAT64, &e));
    for (int i = 0; i < n * 100; i++)
        CHECK(f64b[i] == (double)-i, "all_gather in place [%d] = %g", i, f64b[i]);

    /* reduce_scatter: block q of rank r's input holds r + q + i */
    i32b = malloc((size_t)n * 64 * sizeof *i32b);
    CHECK(i32b, "out of memory");
    for (int q = 0; q < n; q++)
        for (int i = 0; i < 64; i++)
            i32b[q * 64 + i] = r + q + i;
    OK(api->reduce_scatter(g, i32, i32b, 64, NDIST_INT32, NDIST_SUM, &e));
    for (int i = 0; i < 64; i++)
        CHECK(i32[i] == n * (n - 1) / 2 + n * (r + i), "reduce_scatter [%d] = %d", i, i32[i]);

    /* all_to_all: block q from rank r holds (7r + 3q + i) mod 256 */
    size_t blk = 50;
    u8 = malloc((size_t)n * blk);
    u8b = malloc((size_t)n * blk);
    CHECK(u8 && u8b, "out of memory");
    for (int q = 0; q < n; q++)
        for (size_t i = 0; i < blk; i++)
            u8[q * blk + i] = (uint8_t)(7 * r + 3 * q + i);
    OK(api->all_to_all(g, u8b, u8, (size_t)n * blk, NDIST_UINT8, &e));
    for (int q = 0; q < n; q++)
        for (size_t i = 0; i < blk; i++)
            CHECK(u8b[q * blk + i] == (uint8_t)(7 * q + 3 * r + i), "all_to_all from %d [%zu] = %d", q, i,
                  u8b[q * blk + i]);
    /* all_to_all_v (when the module's table has it): rank r sends (q + 2r) % 4 elements to rank q
     * (some blocks empty), element i of them 1000r + 10q + i; packed in rank order both ways */
    int has_v = api->size >= offsetof(ndist_engine_api, all_to_all_v) + sizeof api->all_to_all_v;
    if (has_v) {
        CHECK(n <= 64, "all_to_all_v: the test takes at most 64 ranks, got %d", n);
        int64_t oc[64], ic[64];
        size_t ototal = 0, itotal = 0;
        for (int q = 0; q < n; q++) {
            ic[q] = (q + 2 * r) % 4, oc[q] = (r + 2 * q) % 4;
            itotal += (size_t)ic[q], ototal += (size_t)oc[q];
        }
        size_t k = 0;
        for (int q = 0; q < n; q++)
            for (int64_t i = 0; i < ic[q]; i++)
                i32b[k++] = 1000 * r + 10 * q + (int32_t)i;
        for (size_t i = 0; i < ototal; i++)
            i32[i] = -1;
        OK(api->all_to_all_v(g, i32, ototal, oc, i32b, itotal, ic, NDIST_INT32, &e));
        k = 0;
        for (int q = 0; q < n; q++)
            for (int64_t i = 0; i < oc[q]; i++, k++)
                CHECK(i32[k] == 1000 * q + 10 * r + i, "all_to_all_v from %d [%lld] = %d", q, (long long)i, i32[k]);
        /* bad arguments: refused before anything is numbered or sent */
        ic[0] = -1;
        REFUSED(NDIST_E_ARGUMENT, api->all_to_all_v(g, i32, ototal, oc, i32b, itotal, ic, NDIST_INT32, &e));
        ic[0] = (2 * r) % 4;
        REFUSED(NDIST_E_ARGUMENT, api->all_to_all_v(g, i32, ototal, oc, i32b, itotal + 1, ic, NDIST_INT32, &e));
        REFUSED(NDIST_E_ARGUMENT, api->all_to_all_v(g, i32, ototal, oc, i32b, itotal, NULL, NDIST_INT32, &e));
        REFUSED(NDIST_E_ARGUMENT, api->all_to_all_v(g, NULL, ototal, oc, i32b, itotal, ic, NDIST_INT32, &e));
        REFUSED(NDIST_E_ARGUMENT, api->all_to_all_v(g, i32, ototal, oc, i32b, itotal, ic, 0, &e));
        REFUSED(NDIST_E_ARGUMENT, api->all_to_all_v(g, i32b, ototal, oc, i32b, itotal, ic, NDIST_INT32, &e));
        ic[0] = INT64_MAX;
        REFUSED(NDIST_E_ARGUMENT, api->all_to_all_v(g, i32, ototal, oc, i32b, itotal, ic, NDIST_INT32, &e));
        ic[0] = (2 * r) % 4;
        oc[r]++; /* what this rank receives from itself is not what it sends itself */
        REFUSED(NDIST_E_ARGUMENT, api->all_to_all_v(g, i32, ototal + 1, oc, i32b, itotal, ic, NDIST_INT32, &e));
        oc[r]--;
        /* no element anywhere: NULL buffers are fine */
        for (int q = 0; q < n; q++)
            oc[q] = ic[q] = 0;
        OK(api->all_to_all_v(g, NULL, 0, oc, NULL, 0, ic, NDIST_INT8, &e));
    }
    OK(api->barrier(g, &e));
    /* no element: NULL buffers are fine */
    OK(api->all_reduce(g, NULL, 0, NDIST_FLOAT32, NDIST_AVG, &e));
    OK(api->all_gather(g, NULL, NULL, 0, NDIST_INT8, &e));
    OK(api->all_to_all(g, NULL, NULL, 0, NDIST_INT8, &e));

    /* bad arguments: refused before anything is numbered or sent, the group usable */
    REFUSED(NDIST_E_ARGUMENT, api->all_reduce(g, f64, 4, 99, NDIST_SUM, &e));
    REFUSED(NDIST_E_ARGUMENT, api->all_reduce(g, f64, 4, NDIST_FLOAT64, 42, &e));
    REFUSED(NDIST_E_ARGUMENT, api->all_reduce(g, f32, 4, NDIST_FLOAT32, NDIST_BAND, &e));
    REFUSED(NDIST_E_ARGUMENT, api->all_reduce(g, NULL, 4, NDIST_FLOAT64, NDIST_SUM, &e));
    REFUSED(NDIST_E_ARGUMENT, api->broadcast(g, f64, 4, NDIST_FLOAT64, n, &e));
    REFUSED(NDIST_E_ARGUMENT, api->all_reduce(g, f64, SIZE_MAX / 2, NDIST_FLOAT64, NDIST_SUM, &e));
    if (n > 1)
        REFUSED(NDIST_E_ARGUMENT, api->all_to_all(g, u8b, u8, (size_t)n * blk - 1, NDIST_UINT8, &e));
    REFUSED(NDIST_E_ARGUMENT, api->all_gather(g, f64b, f64b + 1, 100, NDIST_FLOAT64, &e));
    REFUSED(NDIST_E_CLOSED, api->barrier(g ^ ((uint64_t)0x5a5a << 40), &e));
    REFUSED(NDIST_E_CLOSED, api->barrier(0, &e));
    f64[0] = r;
    OK(api->all_reduce(g, f64, 1, NDIST_FLOAT64, NDIST_SUM, &e));
    CHECK(f64[0] == n * (n - 1) / 2.0, "all_reduce after refused calls = %g", f64[0]);

    free(i64), free(f64), free(f64b), free(f32), free(i32), free(i32b), free(u8), free(u8b);
    return 0;
fail:
    free(i64), free(f64), free(f64b), free(f32), free(i32), free(i32b), free(u8), free(u8b);
    return 1;
}

static void *thread_main(void *arg)
{
    Job *j = arg;
    return selftest(j) ? (void *)1 : NULL;
}

/* The test, in a new thread (no Python thread state, no GIL); 0 when it passed, else 1 and
 * ``why`` says what failed. */
int capi_selftest_thread(const ndist_engine_api *api, ndist_group g, char *why, size_t whylen)
{
    Job j = {api, g, ""};
    pthread_t t;
    void *res = (void *)1;
    if (pthread_create(&t, NULL, thread_main, &j) != 0) {
        snprintf(why, whylen, "pthread_create failed");
        return 1;
    }
    pthread_join(t, &res);
    snprintf(why, whylen, "%s", j.why);
    return res != NULL;
}

/* Calls while Python runs: a thread of its own (no Python thread state before its first call) makes
 * ``calls`` float64 SUM all_reduces of ``count`` ones, each of which must give the group's size
 * everywhere, the second and later ones once ``capi_calls_go`` was called; ``capi_calls_done``
 * counts those that did (call both with the GIL held, through ``ctypes.PyDLL``: the count moves
 * while a Python thread holds the GIL only if the calls need none); ``capi_calls_join`` waits for
 * the thread: 0, or 1 and ``why``. */
typedef struct {
    const ndist_engine_api *api;
    ndist_group g;
    int calls;
    size_t count;
    atomic_int done, go;
    pthread_t t;
    char why[1400];
} Calls;

static void *calls_main(void *arg)
{
    Calls *c = arg;
    ndist_error e;
    int n = 0;
    double *x = malloc(c->count * sizeof *x);
    if (!x) {
        snprintf(c->why, sizeof c->why, "out of memory");
        return (void *)1;
    }
    if (c->api->group_info(c->g, NULL, &n, &e) != NDIST_OK) {
        snprintf(c->why, sizeof c->why, "group_info: %s: %s", e.type, e.message);
        free(x);
        return (void *)1;
    }
    for (int k = 0; k < c->calls; k++) {
        for (size_t i = 0; i < c->count; i++)
            x[i] = 1.0;
        int s = c->api->all_reduce(c->g, x, c->count, NDIST_FLOAT64, NDIST_SUM, &e);
        if (s != NDIST_OK) {
            snprintf(c->why, sizeof c->why, "call %d: status %d (%s): %s", k, s, e.type, e.message);
            free(x);
            return (void *)1;
        }
        for (size_t i = 0; i < c->count; i++)
            if (x[i] != (double)n) {
                snprintf(c->why, sizeof c->why, "call %d: [%zu] = %g, expected %d", k, i, x[i], n);
                free(x);
                return (void *)1;
            }
        atomic_fetch_add(&c->done, 1);
        while (!atomic_load(&c->go)) /* (after the first call: until the caller says) */
            sched_yield();
    }
    free(x);
    return NULL;
}

void *capi_calls_start(const ndist_engine_api *api, ndist_group g, int calls, size_t count)
{
    Calls *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->api = api, c->g = g, c->calls = calls, c->count = count;
    atomic_init(&c->done, 0);
    atomic_init(&c->go, 0);
    if (pthread_create(&c->t, NULL, calls_main, c) != 0) {
        free(c);
        return NULL;
    }
    return c;
}

int capi_calls_done(void *c) { return atomic_load(&((Calls *)c)->done); }

void capi_calls_go(void *c) { atomic_store(&((Calls *)c)->go, 1); }

int capi_calls_join(void *arg, char *why, size_t whylen)
{
    Calls *c = arg;
    void *res = (void *)1;
    pthread_join(c->t, &res);
    snprintf(why, whylen, "%s", c->why);
    free(c);
    return res != NULL;
}

#ifdef CAPI_TEST_MAIN
/* The program: embeds CPython (ndist's groups live in a Python process), joins the job ndistrun
 * or the test started (env://), runs one collective (the group's set-up), takes the handle, and
 * runs the test with the GIL released, in a thread of its own. Exit status 0: passed. */
#include <Python.h>

int main(void)
{
    Py_Initialize();
    PyObject *m = PyImport_ImportModule("ndist.distributed");
    PyObject *c = m ? PyImport_ImportModule("ndist.collectives") : NULL;
    PyObject *r = c ? PyObject_CallMethod(m, "init_process_group", "s", "socket") : NULL;
    Py_XDECREF(r);
    r = r ? PyObject_CallMethod(m, "barrier", NULL) : NULL;
    Py_XDECREF(r);
    PyObject *h = r ? PyObject_CallMethod(c, "engine_handle", NULL) : NULL;
    const ndist_engine_api *api = h ? PyCapsule_Import(NDIST_ENGINE_CAPSULE, 0) : NULL;
    if (!api) {
        PyErr_Print();
        return 2;
    }
    ndist_group g = PyLong_AsUnsignedLongLong(h);
    Py_DECREF(h);
    char why[1400] = "";
    PyThreadState *ts = PyEval_SaveThread();
    int rc = capi_selftest_thread(api, g, why, sizeof why);
    PyEval_RestoreThread(ts);
    if (rc)
        fprintf(stderr, "capi_test: %s\n", why);
    r = PyObject_CallMethod(m, "destroy_process_group", NULL);
    if (!r)
        PyErr_Print();
    Py_XDECREF(r);
    Py_DECREF(c);
    Py_DECREF(m);
    if (Py_FinalizeEx() < 0)
        return 3;
    return rc;
}
#endif
