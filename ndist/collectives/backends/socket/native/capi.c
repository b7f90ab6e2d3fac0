/* The engine's C interface (ndist_engine.h; docs/native.md, "The C interface"): the table of
 * functions exported as ``_cnative._C_API``, the group handles, and the calls.
 *
 * A handle names an entry of one process-wide table: the group's compiled group (a same-host
 * ``Group``, a ``TcpGroup`` across hosts, or a two-level group's ``TwoGroup``), its C core (a
 * ``FastLane``, clane.c: the bookkeeping FastLane's own methods run, with its failure hook) and
 * its two Python hooks (``native/_capi.py``: ``begin`` numbers and records the call and claims
 * the group's lane; ``end`` finishes AVG, maps a failure to the Python path's error and records
 * the outcome). A handle is (generation << 32) | (index + 1): closing an entry
 * (``capi_close``, when the group is destroyed) bumps nothing in flight, it marks the entry
 * closed; a call that holds it (``users``) finishes, and the last one drops the references.
 * A closed or reused entry's old handle no longer matches its generation: NDIST_E_CLOSED.
 *
 * A call: its arguments are checked without the GIL (NDIST_E_ARGUMENT: nothing numbered, nothing
 * sent); then the C core takes it when it can (``nd_lane_call``: claim, number, record, the op,
 * AVG, the end, on C11 atomics: no GIL on success; the GIL only for a dtype's first sight, for
 * waking the executor's worker, and when the op fails, for the failure hook). What it does not
 * take (engines.h, ND_LANE_NOT_TAKEN) runs, with the GIL, ``begin``, the op with the GIL
 * released, in the same engine code the groups' Python methods run (``nd_shm_run`` /
 * ``nd_tcp_run`` / ``nd_two_run``, engines.h), then ``end``. The caller needs no GIL and no
 * Python thread state (``thread_state``: a thread without one gets one on its first call, kept);
 * one that holds the GIL runs the core with it, released around the op. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "ctcp.h"
#include "ndist_engine.h"
#include "engines.h"

/* element bytes per dtype code (wire/_frame.py's _DTYPES; 0: no such code) */
static const Py_ssize_t ESIZES[] = {0, 1, 1, 1, 2, 2, 4, 4, 8, 8, 2, 4, 8, 8, 16, 2, 1, 1};
#define NDTYPES ((int)(sizeof ESIZES / sizeof ESIZES[0]))

typedef struct {
    uint32_t gen;       /* the generation its handles carry */
    int open;           /* 0 once closed (the group destroyed) */
    int users;          /* calls holding it now */
    PyObject *group;    /* the Group, TcpGroup or TwoGroup (owned while open or in use) */
    int kind;           /* G_SHM, G_TCP or G_TWO (engines.h) */
    PyObject *begin, *end;
    PyObject *lane;     /* the group's C core (a FastLane: clane.c), or NULL: every call takes begin / end */
    PyObject *fail;     /* the core's failure hook: (err, entry, seq) -> the error tuple */
    PyObject *dtypes;   /* NumPy's dtype of each dtype code (None: none), for the core's record */
    Py_ssize_t rsag_min; /* all_reduce above this many bytes: reduce-scatter + all-gather (_engine.RSAG_MIN) */
    int rank, size;
} Entry;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static Entry *entries;
static uint32_t nentries;

/* the entry's fields a call needs, copied under the lock */
typedef struct {
    uint32_t index;
    int kind;
    PyObject *group, *begin, *end, *lane, *fail, *dtypes;
    Py_ssize_t rsag_min;
    int rank, size;
} Held_;

static void set_err(ndist_error *err, int status, const char *type, int rank, int usable, const char *fmt, ...)
{
    if (!err)
        return;
    err->status = status;
    err->rank = rank;
    err->usable = usable;
    snprintf(err->type, sizeof err->type, "%s", type);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
}

/* take handle ``h`` for a call (0), or NDIST_E_CLOSED */
static int acquire(ndist_group h, Held_ *out, ndist_error *err)
{
    uint32_t index = (uint32_t)(h & 0xffffffffu), gen = (uint32_t)(h >> 32);
    int ok = 0;
    pthread_mutex_lock(&lock);
    if (index >= 1 && index <= nentries) {
        Entry *e = &entries[index - 1];
        if (e->open && e->gen == gen) {
            e->users++;
            *out = (Held_){index - 1, e->kind, e->group, e->begin, e->end, e->lane, e->fail, e->dtypes, e->rsag_min,
                           e->rank, e->size};
            ok = 1;
        }
    }
    pthread_mutex_unlock(&lock);
    if (!ok) {
        set_err(err, NDIST_E_CLOSED, "DistBackendError", -1, 0,
                "ndist engine handle %#llx is closed (its group was destroyed) or is no handle",
                (unsigned long long)h);
        return NDIST_E_CLOSED;
    }
    return 0;
}

/* an entry's references, once closed and unused: dropped by the caller with the GIL */
#define NREFS 6
static void take_refs(Entry *e, PyObject **refs)
{
    refs[0] = e->group;
    refs[1] = e->begin;
    refs[2] = e->end;
    refs[3] = e->lane;
    refs[4] = e->fail;
    refs[5] = e->dtypes;
    e->group = e->begin = e->end = e->lane = e->fail = e->dtypes = NULL;
}

static void drop_refs(PyObject **refs)
{
    int any = 0;
    for (int i = 0; i < NREFS; i++)
        any |= refs[i] != NULL;
    if (!any)
        return;
    PyGILState_STATE st = PyGILState_Ensure();
    for (int i = 0; i < NREFS; i++)
        Py_XDECREF(refs[i]);
    PyGILState_Release(st);
}

static void release(uint32_t index)
{
    PyObject *refs[NREFS] = {NULL};
    pthread_mutex_lock(&lock);
    Entry *e = &entries[index];
    if (--e->users == 0 && !e->open)
        take_refs(e, refs);
    pthread_mutex_unlock(&lock);
    drop_refs(refs);
}

/* ------------------------------------------------------------------ a call */
/* the buffers of a call of no element (which may be NULL): the engine copies 0 bytes */
static char empty[ND_ALIGN];

static const char *OPNAME[] = {"", "all_reduce", "", "broadcast", "all_gather", "", "", "all_to_all",
                               "reduce_scatter", "barrier"};

/* ``err`` from the hooks' error tuple (status, rank, usable, type, message); the status */
static int err_from(PyObject *t, ndist_error *err)
{
    int status, rank, usable;
    const char *type, *msg;
    if (!PyArg_ParseTuple(t, "iiiss", &status, &rank, &usable, &type, &msg))
        return -1;
    set_err(err, status, type, rank, usable, "%s", msg);
    return status;
}

/* ``err`` from the Python exception set now (a hook's own failure): NDIST_E_INTERNAL */
static int err_from_exc(ndist_error *err, const char *where)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *s = value ? PyObject_Str(value) : NULL;
    const char *msg = s ? PyUnicode_AsUTF8(s) : NULL;
    if (!msg)
        PyErr_Clear();
    set_err(err, NDIST_E_INTERNAL, type ? ((PyTypeObject *)type)->tp_name : "?", -1, 0, "%s: %s", where,
            msg ? msg : "(no message)");
    Py_XDECREF(s);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return NDIST_E_INTERNAL;
}

static PyObject *view(const void *p, Py_ssize_t n, int writable)
{
    if (!p) /* (a zero-count buffer may be NULL) */
        Py_RETURN_NONE;
    return PyMemoryView_FromMemory((char *)p, n, writable ? PyBUF_WRITE : PyBUF_READ);
}

/* the call on the group's C core (clane.c's ``nd_lane_call``: the bookkeeping FastLane's methods
 * do), with the GIL (``ts`` NULL) or without it (``ts``: this thread's state; the GIL is taken here
 * only when the op failed, for the failure hook, or a Python error came), or -1: not taken (the
 * Python hooks take it, ``run_locked``) */
static int run_core(Held_ *h, NdOp *op, Py_ssize_t count_in, Py_ssize_t count_out, PyThreadState *ts,
                    ndist_error *err)
{
    NdLaneOut out = {0};
    int rc = nd_lane_call(h->lane, op, count_in, count_out, h->dtypes, ts, &out);
    if (rc == ND_LANE_NOT_TAKEN)
        return -1;
    if (rc == 0)
        return NDIST_OK;
    PyGILState_STATE st = PyGILState_UNLOCKED;
    if (ts)
        st = PyGILState_Ensure();
    int status;
    if (rc < 0) {
        if (ts)
            PyErr_Restore(out.err[0], out.err[1], out.err[2]);
        status = err_from_exc(err, "ndist engine");
    } else { /* the op failed: the hook maps it as ``end`` does, ends the claim and records it */
        PyObject *entry, *seq, *exc;
        nd_lane_failed(h->lane, &out, &exc, &entry, &seq);
        PyObject *res = PyObject_CallFunctionObjArgs(h->fail, exc ? exc : Py_None, entry ? entry : Py_None, seq,
                                                     NULL);
        if (!res)
            status = err_from_exc(err, "ndist engine (failure)");
        else if ((status = err_from(res, err)) < 0)
            status = err_from_exc(err, "ndist engine (failure)");
        Py_XDECREF(res);
        Py_XDECREF(exc);
        Py_XDECREF(entry);
        Py_XDECREF(seq);
    }
    if (ts)
        PyGILState_Release(st);
    return status;
}

/* a list of ``n`` counts (a new reference), or NULL with an error set */
static PyObject *counts_list(const Py_ssize_t *c, int n)
{
    PyObject *l = PyList_New(n);
    for (int q = 0; l && q < n; q++) {
        PyObject *v = PyLong_FromSsize_t(c[q]);
        if (!v) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, q, v);
    }
    return l;
}

/* with the GIL: begin, the op without the GIL, end */
static int run_locked(Held_ *h, NdOp *op, Py_ssize_t count_in, Py_ssize_t count_out, ndist_error *err)
{
    int status = NDIST_OK;
    PyObject *outv = view(op->out, op->outbytes, 1), *inv = view(op->in, op->inbytes, 0);
    PyObject *b = NULL, *res = NULL, *exc = NULL;
    if (!outv || !inv) {
        status = err_from_exc(err, "ndist engine");
        goto out;
    }
    if (op->out_counts) { /* split sizes (elements): the record's per-rank counts (DETAIL compares them) */
        b = PyObject_CallFunction(h->begin, "iinniiOONN", op->op, op->dtype, count_in, count_out, op->root,
                                  op->redop, outv, inv, counts_list(op->out_counts, h->size),
                                  counts_list(op->in_counts, h->size));
    } else
        b = PyObject_CallFunction(h->begin, "iinniiOO", op->op, op->dtype, count_in, count_out, op->root,
                                  op->redop, outv, inv);
    if (!b) {
        status = err_from_exc(err, "ndist engine (begin)");
        goto out;
    }
    if (!PyTuple_Check(b) || (PyTuple_GET_SIZE(b) != 2 && PyTuple_GET_SIZE(b) != 5)) {
        set_err(err, NDIST_E_INTERNAL, "TypeError", -1, 0, "ndist engine: begin returned no 2- or 5-tuple");
        status = NDIST_E_INTERNAL;
        goto out;
    }
    if (PyTuple_GET_SIZE(b) == 5) { /* refused before the op: a bad argument, a broken or closed group */
        if ((status = err_from(b, err)) < 0)
            status = err_from_exc(err, "ndist engine (begin)");
        goto out;
    }
    PyObject *token = PyTuple_GET_ITEM(b, 0), *fb = PyTuple_GET_ITEM(b, 1);
    op->fallback = fb == Py_None ? NULL : fb;
    PyThreadState *save = PyEval_SaveThread();
    int rc = nd_group_run(h->kind, h->group, op, &save);
    PyEval_RestoreThread(save);
    if (rc) /* the exception the group's method raises, for end to map */
        exc = nd_group_exception(h->kind, h->group, rc);
    res = PyObject_CallFunctionObjArgs(h->end, token, exc ? exc : Py_None, NULL);
    if (!res)
        status = err_from_exc(err, "ndist engine (end)");
    else if (PyTuple_Check(res) && PyTuple_GET_SIZE(res) == 1) {
        /* the op ran (NDIST_OK), waking the executor's worker after it failed: reported, as the C
         * core reports it (clane.c's ``leave``) */
        PyObject *w = PyTuple_GET_ITEM(res, 0);
        PyErr_Restore(Py_NewRef(Py_TYPE(w)), Py_NewRef(w), PyException_GetTraceback(w));
        PyErr_WriteUnraisable(h->end);
    } else if (res != Py_None && (status = err_from(res, err)) < 0)
        status = err_from_exc(err, "ndist engine (end)");
out:
    Py_XDECREF(res);
    Py_XDECREF(exc);
    Py_XDECREF(b);
    Py_XDECREF(outv);
    Py_XDECREF(inv);
    return status;
}

/* This thread's Python thread state when it does not hold the GIL (not current), or NULL when it
 * holds it. A thread Python never saw gets one on its first call (PyGILState_Ensure's, the GIL
 * let go at once and the state kept for the thread's life), so that no later call makes one and
 * the engine can restore it for a moment to call back into Python, as for a Python caller. */
static PyThreadState *thread_state(void)
{
    PyThreadState *ts = PyGILState_GetThisThreadState();
#if PY_VERSION_HEX >= 0x030D0000
    PyThreadState *now = PyThreadState_GetUnchecked();
#else
    PyThreadState *now = _PyThreadState_UncheckedGet();
#endif
    if (ts && ts == now) /* (3.11: the GIL holder's state; 3.12 on: this thread's, when it holds it) */
        return NULL;
    if (ts)
        return ts;
    (void)PyGILState_Ensure(); /* (its count stays at one: never released, the state stays) */
    return PyEval_SaveThread();
}

/* a checked call: on the group's C core when it takes it (with the GIL only where the core needs
 * it: none on success), else with the GIL through the Python hooks */
static int dispatch(Held_ *h, NdOp *op, Py_ssize_t count_in, Py_ssize_t count_out, ndist_error *err)
{
    int status = h->lane ? run_core(h, op, count_in, count_out, thread_state(), err) : -1;
    if (status < 0) {
        PyGILState_STATE st = PyGILState_Ensure();
        status = run_locked(h, op, count_in, count_out, err);
        PyGILState_Release(st);
    }
    return status;
}

static int bad(ndist_error *err, const char *fmt, ...)
{
    if (err) {
        char msg[sizeof err->message];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        set_err(err, NDIST_E_ARGUMENT, "ValueError", -1, 1, "%s", msg);
    }
    return NDIST_E_ARGUMENT;
}

/* bytes of ``count`` elements of ``esize`` times ``k``, or -1 past PY_SSIZE_T_MAX */
static Py_ssize_t bytes_of(size_t count, Py_ssize_t esize, int k)
{
    if (count > (size_t)PY_SSIZE_T_MAX / (size_t)esize / (size_t)k)
        return -1;
    return (Py_ssize_t)(count * (size_t)esize * (size_t)k);
}

static int overlap(const char *a, Py_ssize_t na, const char *b, Py_ssize_t nb)
{
    return a && b && na > 0 && nb > 0 && a < b + nb && b < a + na;
}

/* The checks of one call, then the call. ``in_k`` / ``out_k``: the input's and output's counts
 * in units of ``count`` (0: no such buffer; -1: ``count`` itself, n blocks of it). */
static int call(ndist_group g, int opc, void *out, const void *in, size_t count, int dtype, int redop, int root,
                ndist_error *err)
{
    Held_ h;
    int status = acquire(g, &h, err);
    if (status)
        return status;
    const char *name = OPNAME[opc];
    int n = h.size;
    NdOp op = {opc, dtype, redop, root, 0, 0, NULL, out, 0, in, 0};
    Py_ssize_t cin = 0, cout = 0; /* the record's counts (elements), as the Python path's */
    if (opc != OP_BARRIER) {
        if (dtype < 1 || dtype >= NDTYPES) {
            status = bad(err, "%s: dtype: expected a dtype code in [1, %d] (ndist_engine.h), got %d", name,
                         NDTYPES - 1, dtype);
            goto done;
        }
        op.esize = ESIZES[dtype];
        int k = opc == OP_ALL_GATHER || opc == OP_REDUCE_SCATTER ? n : 1;
        Py_ssize_t one = bytes_of(count, op.esize, 1), many = bytes_of(count, op.esize, k);
        if (one < 0 || many < 0) {
            status = bad(err, "%s: count: expected at most %zd elements, got %zu", name,
                         PY_SSIZE_T_MAX / op.esize / k, count);
            goto done;
        }
        if (opc == OP_ALL_TO_ALL && count % (size_t)n) {
            status = bad(err, "%s: count: expected a multiple of the group size %d, got %zu", name, n, count);
            goto done;
        }
        if (opc == OP_ALL_GATHER) {
            op.outbytes = many;
            op.inbytes = one;
            cin = (Py_ssize_t)count, cout = (Py_ssize_t)count * n;
        } else if (opc == OP_REDUCE_SCATTER) {
            op.outbytes = one;
            op.inbytes = many;
            cin = (Py_ssize_t)count * n, cout = (Py_ssize_t)count;
        } else {
            op.outbytes = one;
            op.inbytes = opc == OP_ALL_TO_ALL ? one : 0;
            cin = cout = (Py_ssize_t)count;
        }
        if (count && (!out || (op.inbytes && !in))) {
            status = bad(err, "%s: expected buffers for %zu elements, got a NULL pointer", name, count);
            goto done;
        }
        if (!count) { /* no element: the engine copies 0 bytes, never from or to NULL */
            op.out = empty;
            op.in = empty;
        }
        if (opc == OP_BROADCAST && (root < 0 || root >= n)) {
            status = bad(err, "%s: root: expected a group rank in [0, %d), got %d", name, n, root);
            goto done;
        }
        if (opc == OP_ALL_REDUCE || opc == OP_REDUCE_SCATTER) {
            if (redop < NDIST_SUM || redop > NDIST_BXOR) {
                status = bad(err, "%s: op: expected a reduce op code in [%d, %d] (ndist_engine.h), got %d", name,
                             NDIST_SUM, NDIST_BXOR, redop);
                goto done;
            }
            op.rsag = opc == OP_ALL_REDUCE && h.rsag_min >= 0 && one > h.rsag_min;
        }
        /* all_gather in place: ``in`` is this rank's block of ``out``; any other overlap is refused
         * (the Python path copies an overlapping input first) */
        int inplace = opc == OP_ALL_GATHER && in == (const char *)out + (size_t)h.rank * (size_t)one;
        if (!inplace && overlap(out, op.outbytes, in, op.inbytes)) {
            status = bad(err, "%s: in: expected a buffer apart from out, got one that overlaps it", name);
            goto done;
        }
    }
    status = dispatch(&h, &op, cin, cout, err);
done:
    release(h.index);
    return status;
}

static int c_group_info(ndist_group g, int *rank, int *size, ndist_error *err)
{
    Held_ h;
    int status = acquire(g, &h, err);
    if (status)
        return status;
    if (rank)
        *rank = h.rank;
    if (size)
        *size = h.size;
    release(h.index);
    return NDIST_OK;
}

static int c_all_reduce(ndist_group g, void *buf, size_t count, int dtype, int op, ndist_error *err)
{
    return call(g, OP_ALL_REDUCE, buf, NULL, count, dtype, op, -1, err);
}

static int c_broadcast(ndist_group g, void *buf, size_t count, int dtype, int root, ndist_error *err)
{
    return call(g, OP_BROADCAST, buf, NULL, count, dtype, 0, root, err);
}

static int c_all_gather(ndist_group g, void *out, const void *in, size_t count, int dtype, ndist_error *err)
{
    return call(g, OP_ALL_GATHER, out, in, count, dtype, 0, -1, err);
}

static int c_reduce_scatter(ndist_group g, void *out, const void *in, size_t count, int dtype, int op,
                            ndist_error *err)
{
    return call(g, OP_REDUCE_SCATTER, out, in, count, dtype, op, -1, err);
}

static int c_all_to_all(ndist_group g, void *out, const void *in, size_t count, int dtype, ndist_error *err)
{
    return call(g, OP_ALL_TO_ALL, out, in, count, dtype, 0, -1, err);
}

static int c_barrier(ndist_group g, ndist_error *err)
{
    return call(g, OP_BARRIER, NULL, NULL, 0, 0, 0, -1, err);
}

/* ``name`` (in_counts / out_counts): ``n`` counts of at most ``max`` elements in all, none negative,
 * summing to ``total``, into ``c``; NDIST_OK or NDIST_E_ARGUMENT */
static int counts_of(const int64_t *counts, const char *name, int n, size_t total, Py_ssize_t max, Py_ssize_t *c,
                     ndist_error *err)
{
    if (!counts)
        return bad(err, "all_to_all_v: %s: expected %d counts, got a NULL pointer", name, n);
    Py_ssize_t sum = 0;
    for (int q = 0; q < n; q++) {
        if (counts[q] < 0)
            return bad(err, "all_to_all_v: %s[%d]: expected a count >= 0, got %lld", name, q, (long long)counts[q]);
        if (counts[q] > max - sum)
            return bad(err, "all_to_all_v: %s: expected at most %zd elements in all, got %lld more at [%d] after %zd",
                       name, max, (long long)counts[q], q, sum);
        c[q] = (Py_ssize_t)counts[q];
        sum += c[q];
    }
    if ((size_t)sum != total)
        return bad(err, "all_to_all_v: %s: counts sum to %zd, but the buffer has %zu elements", name, sum, total);
    return NDIST_OK;
}

static int c_all_to_all_v(ndist_group g, void *out, size_t out_count, const int64_t *out_counts, const void *in,
                          size_t in_count, const int64_t *in_counts, int dtype, ndist_error *err)
{
    Held_ h;
    int status = acquire(g, &h, err);
    if (status)
        return status;
    int n = h.size, r = h.rank;
    Py_ssize_t *c = NULL;
    NdOp op = {OP_ALL_TO_ALL, dtype, 0, -1, 0, 0, NULL, out, 0, in, 0, NULL, NULL};
    if (dtype < 1 || dtype >= NDTYPES) {
        status = bad(err, "all_to_all_v: dtype: expected a dtype code in [1, %d] (ndist_engine.h), got %d",
                     NDTYPES - 1, dtype);
        goto done;
    }
    op.esize = ESIZES[dtype];
    Py_ssize_t max = PY_SSIZE_T_MAX / op.esize;
    if (out_count > (size_t)max || in_count > (size_t)max) {
        status = bad(err, "all_to_all_v: expected at most %zd elements a buffer, got out_count %zu, in_count %zu",
                     max, out_count, in_count);
        goto done;
    }
    if (!(c = malloc(2 * (size_t)n * sizeof *c))) {
        set_err(err, NDIST_E_INTERNAL, "MemoryError", -1, 1, "all_to_all_v: no memory for %d counts", 2 * n);
        status = NDIST_E_INTERNAL;
        goto done;
    }
    if ((status = counts_of(out_counts, "out_counts", n, out_count, max, c, err)) ||
        (status = counts_of(in_counts, "in_counts", n, in_count, max, c + n, err)))
        goto done;
    if (c[r] != c[n + r]) {
        status = bad(err, "all_to_all_v: out_counts[%d]: expected %zd (in_counts[%d], what this rank sends itself), "
                     "got %zd", r, c[n + r], r, c[r]);
        goto done;
    }
    if ((out_count && !out) || (in_count && !in)) {
        status = bad(err, "all_to_all_v: expected buffers for %zu and %zu elements (out, in), got a NULL pointer",
                     out_count, in_count);
        goto done;
    }
    op.outbytes = (Py_ssize_t)out_count * op.esize;
    op.inbytes = (Py_ssize_t)in_count * op.esize;
    if (!out_count) /* no element: the engine copies 0 bytes, never from or to NULL */
        op.out = empty;
    if (!in_count)
        op.in = empty;
    if (overlap(op.out, op.outbytes, op.in, op.inbytes)) {
        status = bad(err, "all_to_all_v: in: expected a buffer apart from out, got one that overlaps it");
        goto done;
    }
    op.out_counts = c, op.in_counts = c + n;
    status = dispatch(&h, &op, (Py_ssize_t)in_count, (Py_ssize_t)out_count, err);
done:
    free(c);
    release(h.index);
    return status;
}

static const ndist_engine_api API = {
    NDIST_ENGINE_API_VERSION, (uint32_t)sizeof(ndist_engine_api), c_group_info, c_all_reduce, c_broadcast,
    c_all_gather, c_reduce_scatter, c_all_to_all, c_barrier, c_all_to_all_v,
};

/* ------------------------------------------------------------------ Python side */
/* capi_open(group, begin, end, rsag_min, lane=None, fail=None, dtypes=None) -> handle: a new entry
 * for ``group``, a same-host Group, a TcpGroup (one with a view, a two-level group's, runs no op:
 * ND_SHM_BROKEN) or a TwoGroup (ctwo.c: a two-level group's ops). ``lane``: the group's C core (a
 * FastLane), which runs what it takes with no Python-level call; ``fail`` its failure hook,
 * ``dtypes`` NumPy's dtype of each code. */
static PyObject *capi_open(PyObject *mod, PyObject *args)
{
    PyObject *group, *begin, *end, *lane = Py_None, *fail = Py_None, *dtypes = Py_None;
    Py_ssize_t rsag_min;
    if (!PyArg_ParseTuple(args, "OOOn|OOO:capi_open", &group, &begin, &end, &rsag_min, &lane, &fail, &dtypes))
        return NULL;
    if (lane != Py_None && (!nd_lane_is(lane) || !PyCallable_Check(fail) || !PyTuple_Check(dtypes) ||
                            PyTuple_GET_SIZE(dtypes) != NDTYPES)) {
        PyErr_Format(PyExc_TypeError, "capi_open: lane: expected a FastLane with a callable fail and a tuple of "
                     "%d dtypes, got %s", NDTYPES, Py_TYPE(lane)->tp_name);
        return NULL;
    }
    int kind = nd_tcp_is(group) ? G_TCP : nd_shm_is(group) ? G_SHM : nd_two_is(group) ? G_TWO : -1;
    if (kind < 0) {
        PyErr_Format(PyExc_TypeError, "capi_open: group: expected a _cnative.Group, TcpGroup or TwoGroup, got %s",
                     Py_TYPE(group)->tp_name);
        return NULL;
    }
    if (!PyCallable_Check(begin) || !PyCallable_Check(end)) {
        PyErr_SetString(PyExc_TypeError, "capi_open: begin and end must be callable");
        return NULL;
    }
    pthread_mutex_lock(&lock);
    uint32_t i = 0;
    while (i < nentries && (entries[i].open || entries[i].users || entries[i].group))
        i++;
    if (i == nentries) {
        Entry *grown = realloc(entries, (nentries + 16) * sizeof(Entry));
        if (!grown) {
            pthread_mutex_unlock(&lock);
            return PyErr_NoMemory();
        }
        memset(grown + nentries, 0, 16 * sizeof(Entry));
        entries = grown;
        nentries += 16;
    }
    Entry *e = &entries[i];
    e->gen++;
    e->open = 1;
    e->users = 0;
    e->group = Py_NewRef(group);
    e->begin = Py_NewRef(begin);
    e->end = Py_NewRef(end);
    e->lane = lane == Py_None ? NULL : Py_NewRef(lane);
    e->fail = lane == Py_None ? NULL : Py_NewRef(fail);
    e->dtypes = lane == Py_None ? NULL : Py_NewRef(dtypes);
    e->rsag_min = rsag_min;
    e->kind = kind;
    nd_group_geometry(kind, group, &e->rank, &e->size);
    uint64_t h = ((uint64_t)e->gen << 32) | (i + 1);
    pthread_mutex_unlock(&lock);
    return PyLong_FromUnsignedLongLong(h);
}

/* capi_close(handle): the group is destroyed; later calls on the handle return NDIST_E_CLOSED */
static PyObject *capi_close(PyObject *mod, PyObject *arg)
{
    unsigned long long h = PyLong_AsUnsignedLongLong(arg);
    if (h == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    uint32_t index = (uint32_t)(h & 0xffffffffu), gen = (uint32_t)(h >> 32);
    PyObject *refs[NREFS] = {NULL};
    pthread_mutex_lock(&lock);
    if (index >= 1 && index <= nentries && entries[index - 1].gen == gen && entries[index - 1].open) {
        Entry *e = &entries[index - 1];
        e->open = 0;
        if (!e->users)
            take_refs(e, refs);
    }
    pthread_mutex_unlock(&lock);
    for (int i = 0; i < NREFS; i++) /* (the GIL is held) */
        Py_XDECREF(refs[i]);
    Py_RETURN_NONE;
}

static PyMethodDef capi_methods[] = {
    {"capi_open", capi_open, METH_VARARGS,
     "capi_open(group, begin, end, rsag_min, lane=None, fail=None, dtypes=None) -> handle: a C interface "
     "handle for a Group or TcpGroup"},
    {"capi_close", capi_close, METH_O, "capi_close(handle): calls on it return NDIST_E_CLOSED from now on"},
    {NULL, NULL, 0, NULL},
};

int nd_capi_add(PyObject *m)
{
    PyObject *cap = PyCapsule_New((void *)&API, NDIST_ENGINE_CAPSULE, NULL);
    if (!cap || PyModule_AddObject(m, "_C_API", cap) < 0) {
        Py_XDECREF(cap);
        return -1;
    }
    if (PyModule_AddFunctions(m, capi_methods) < 0)
        return -1;
    return PyModule_AddIntConstant(m, "CAPI_VERSION", NDIST_ENGINE_API_VERSION);
}
