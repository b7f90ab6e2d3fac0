/* The repeated call in one C call (docs/architecture.md, "One call, by hand"): ``LaneState``,
 * the socket backend's executor flag and sequence number as a C struct, and ``FastLane``, a
 * group's repeated blocking collectives on the native engine, reached from the public function
 * (``ndist.distributed.all_reduce``: ``pg.fast.all_reduce(tensor, op)``) with no other Python frame.
 *
 * A FastLane method takes the public function's arguments. When they are the common case (NumPy
 * arrays as the public layer's plain checks take them, see each method) it does, in this order,
 * what the Python path does (``_plain.PlainLane`` -> ``run_fields`` -> ``SocketBackend._inline``):
 *
 *   the claim: the group's executor flag (``LaneState``, test-and-set, after checking the backend
 *   open and nothing queued), then the group's first failure (``NativeAlgorithms.broken``: the
 *   flag is let go and the Python path raises it), all read from LaneState's C11 atomics;
 *   the record: the lane's sequence number and the flight recorder's entry, written in C into the
 *   group's ``Counter`` and ``Ring`` (crecord.h: no Python object; the entry becomes the 10-list
 *   ``run_fields`` writes when it is read or its op fails), the backend's sequence
 *   number (into the group's headers), the op for messages (the lane's own fields,
 *   ``current()``, which ``NativeAlgorithms.desc`` reads);
 *   the op: the engine's own code (``nd_shm_run`` / ``nd_tcp_run`` / ``nd_two_run``, engines.h) with the GIL
 *   released; AVG's division (floats: x / n in the dtype; integers: the sum truncated toward
 *   zero, ``_intavg.py``);
 *   the end: the entry's end time, the flag cleared (the worker woken if a job was queued
 *   meanwhile). A failure calls the Python hook ``failure(err, entry, seq)`` (``native/_fast.py``),
 *   which maps it to the typed error, ends the claim and records it, as the Python path does.
 *
 * That bookkeeping (``core``) touches no Python object, so the C interface (capi.c,
 * ``nd_lane_call``) runs it without the GIL; FastLane's methods run it with the GIL they hold.
 *
 * The ops: all_reduce, broadcast, all_to_all_single (even, and with split sizes as lists or
 * tuples of Python ints), all_gather_into_tensor, reduce_scatter_tensor and barrier. Anything
 * else (another array type, a flag, a dtype or op the engine has no kernel for, a busy or broken
 * group, split sizes of another kind) is handed, unchanged, to the group's Python lane
 * (``plain``, a ``collectives/_plain.py`` ``PlainLane``), whose methods return what these
 * return: True when the call ran, False when the public function's general path must take it.
 * Created by ``native/_fast.py`` only where NDIST_DEBUG is not DETAIL (DETAIL's signature check
 * runs in Python) and the group runs the native engine: a same-host ``Group``, a ``TcpGroup``
 * without a view, or a two-level group's ``TwoGroup`` (ctwo.c).
 *
 * NumPy arrays are read through NumPy's stable object layout (``PyArrayObject_fields``: data,
 * nd, dimensions, strides, base, descr, flags; the same fields NumPy's own inline accessors
 * read), checked once against a probe array when a FastLane is made. ``read_arg`` reads every
 * buffer argument of the six ops: a ``numpy.ndarray`` (first, through that layout), an
 * ``ndist.Tensor`` over one (one attribute read, ``_data``), a torch CPU tensor (``torch.Tensor``
 * or ``torch.nn.Parameter``: ``is_neg()``, then an owning DLPack tensor from torch's DLPack C
 * exchange table, no Python frame, no capsule), any other object with ``__dlpack__`` (a
 * versioned DLPack capsule, asked as ``np.from_dlpack`` asks it) and an object that only exports
 * the buffer protocol (a memoryview, bytearray, array.array...: ``PyObject_GetBuffer`` once per
 * call, the dtype from its struct format as ``_convert.BUFFER_FORMATS`` maps it). What the Python
 * path would refuse, stage or copy (not CPU memory, not C-contiguous, read-only where the op
 * writes, a dtype NumPy gives another meaning) is handed to the Python lane unchanged. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "common.h"
#include "crecord.h"
#include "engines.h"

/* ------------------------------------------------------------------ LaneState */
/* The executor's state (``_executor.py``) as C11 atomics, so that the C core claims a group's lane
 * with the GIL or without it (a C interface call holds none), and the facts the claim needs:
 *
 *   busy     the executor's flag, taken by test-and-set (``claim``) by every path: Executor.claim,
 *            run_inline, submit's inline branch, the worker (before it pops a job), the C core;
 *   seq      the backend's last sequence number (``next``: one atomic add, with or without the GIL);
 *   queued   the jobs in the executor's queue, stored by the executor (under its lock) after each
 *            append and pop, and 0 at its close: the queue's length, for C;
 *   closed   the executor's and its backend's one closed flag (``SocketBackend.close`` sets it first,
 *            ``Executor.close`` too), never cleared;
 *   broken   set when ``NativeAlgorithms.broken`` is (its setter), cleared only where it is;
 *   drainers the threads waiting in ``Executor.drain`` (changed under the executor's lock): ``leave``
 *            wakes them as it wakes the worker, so they wait for a notification, not a tick (the
 *            same order argument as for ``queued`` below, with the drainer's count for the job's).
 *
 * Why the C core's claim (clane.c's ``claim``: closed, queued, the flag, broken, in that order; all
 * sequentially consistent) keeps the Python executor's order and errors:
 *   - a blocking call never overtakes an async op queued before it on the group: the job's
 *     ``queued`` store happens before its ``submit`` returns, so a later call sees queued > 0 and
 *     goes to the Python path, which waits behind the job; ``queued`` drops only when the worker
 *     pops the job, which it does holding the flag, so a call that sees 0 either finds the flag
 *     taken (the job runs) or comes after the job ended;
 *   - a job queued while the C core holds the flag is never stranded: the worker tests the flag
 *     under the executor's lock after the job's ``queued`` store; the core clears the flag, then
 *     loads ``queued`` (the store before the load, in the one total order of seq_cst
 *     operations), so either the worker's test sees the flag clear or the core sees the job and
 *     wakes the worker (``Executor.wake``, with the GIL), which then takes the lock and tests again;
 *   - after ``close`` (its flag store comes first in ``SocketBackend.close``) or once a failure
 *     broke the group (the Python attribute is set before the flag), the core takes nothing:
 *     the Python path runs the call and raises what it raised before (the closed backend's
 *     error, the first failure again). A close or a failure that comes during the claim is the
 *     race it was with the GIL: the op runs on the group and fails there as it would have.
 *
 * Why the GIL-free path has no data race (C11's memory model: ThreadSanitizer checks it, docs/native.md,
 * "Thread safety"):
 *   - ``busy`` is the lock of everything a claimant touches without atomics (the group's engine
 *     state, its ``seq`` for headers, the op's buffers): taken by a sequentially consistent
 *     compare-and-swap (an acquire) and let go by a sequentially consistent store (a release),
 *     so each claimant's accesses happen before the next claimant's, whichever thread and
 *     whether or not it holds the GIL. A Python path that takes the flag (``claim``) and clears
 *     it (``clear``) goes through the same two operations;
 *   - what a non-claimant reads while a claimant writes is atomic: these five fields, the
 *     counter and the flight recorder's ring (crecord.h: relaxed fields in a seqlock, its
 *     argument there), the C interface's dtype facts (``CodeInfo``: relaxed fields published by
 *     a release store of ``ready``) and the op described for messages (FastLane's ``cur_*``:
 *     relaxed fields in a seqlock whose one writer at a time is the claimant, with Boehm's fences:
 *     the writer's release fence after its odd ``cur_gen``, the reader's acquire fence before
 *     its second load; ``set_current`` and ``current``);
 *   - a FastLane's other fields are set by its ``__init__`` before it is handed out (the group's
 *     lane, the C interface's entry under capi.c's mutex) and only read after. */
typedef struct {
    PyObject_HEAD
    atomic_int busy;
    atomic_int closed, broken, queued, drainers;
    _Atomic unsigned long long seq;
} LaneState;

static PyObject *LaneState_claim(LaneState *s, PyObject *unused)
{
    int zero = 0;
    return PyBool_FromLong(atomic_compare_exchange_strong(&s->busy, &zero, 1));
}

static PyObject *LaneState_clear(LaneState *s, PyObject *unused)
{
    atomic_store(&s->busy, 0);
    Py_RETURN_NONE;
}

static PyObject *LaneState_next(LaneState *s, PyObject *unused)
{
    return PyLong_FromUnsignedLongLong(atomic_fetch_add(&s->seq, 1) + 1);
}

static PyObject *LaneState_busy(LaneState *s, void *unused) { return PyBool_FromLong(atomic_load(&s->busy)); }
static PyObject *LaneState_seq(LaneState *s, void *unused)
{
    return PyLong_FromUnsignedLongLong(atomic_load(&s->seq));
}

/* the flags' getters and setters (``closure``: the field's offset) */
static PyObject *LaneState_get(LaneState *s, void *off)
{
    return PyBool_FromLong(atomic_load((atomic_int *)((char *)s + (size_t)off)));
}

static int LaneState_set(LaneState *s, PyObject *v, void *off)
{
    int on = v ? PyObject_IsTrue(v) : -1;
    if (on < 0) {
        if (!v)
            PyErr_SetString(PyExc_AttributeError, "LaneState: its flags cannot be deleted");
        return -1;
    }
    atomic_store((atomic_int *)((char *)s + (size_t)off), on);
    return 0;
}

/* the counts' getters and setters (``closure``: the field's offset) */
static PyObject *LaneState_get_count(LaneState *s, void *off)
{
    return PyLong_FromLong(atomic_load((atomic_int *)((char *)s + (size_t)off)));
}

static int LaneState_set_count(LaneState *s, PyObject *v, void *off)
{
    long n = v ? PyLong_AsLong(v) : -1;
    if (n < 0 || n > INT32_MAX) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "LaneState.%s: expected an int in [0, %d]",
                         (size_t)off == offsetof(LaneState, queued) ? "queued" : "drainers", INT32_MAX);
        return -1;
    }
    atomic_store((atomic_int *)((char *)s + (size_t)off), (int)n);
    return 0;
}

static PyMethodDef LaneState_methods[] = {
    {"claim", (PyCFunction)LaneState_claim, METH_NOARGS, "claim() -> bool: take the busy flag (test-and-set)"},
    {"clear", (PyCFunction)LaneState_clear, METH_NOARGS, "clear(): release the busy flag"},
    {"next", (PyCFunction)LaneState_next, METH_NOARGS, "next() -> int: seq + 1, taken atomically"},
    {NULL, NULL, 0, NULL},
};
static PyGetSetDef LaneState_getset[] = {
    {"busy", (getter)LaneState_busy, NULL, "an operation holds the flag", NULL},
    {"seq", (getter)LaneState_seq, NULL, "the number of the last operation numbered", NULL},
    {"closed", (getter)LaneState_get, (setter)LaneState_set, "the backend is closed (SocketBackend.close)",
     (void *)offsetof(LaneState, closed)},
    {"broken", (getter)LaneState_get, (setter)LaneState_set, "the group has a first failure (NativeAlgorithms.broken)",
     (void *)offsetof(LaneState, broken)},
    {"queued", (getter)LaneState_get_count, (setter)LaneState_set_count, "the jobs in the executor's queue",
     (void *)offsetof(LaneState, queued)},
    {"drainers", (getter)LaneState_get_count, (setter)LaneState_set_count, "the threads in Executor.drain",
     (void *)offsetof(LaneState, drainers)},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject LaneStateType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_cnative.LaneState",
    .tp_basicsize = sizeof(LaneState),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_methods = LaneState_methods,
    .tp_getset = LaneState_getset,
    .tp_doc = "An executor's busy flag, sequence number, queue length, closed flag and drainer count and "
              "its backend's broken flag, read and written by Python and by C (FastLane, the C interface) alike.",
};

/* ------------------------------------------------------------------ NumPy's layout */
typedef struct {
    PyObject_HEAD
    char *data;
    int nd;
    Py_ssize_t *dimensions;
    Py_ssize_t *strides;
    PyObject *base;
    PyObject *descr;
    int flags;
} NpArray;

#define NP_C_CONTIGUOUS 0x0001
#define NP_ALIGNED 0x0100
#define NP_WRITEABLE 0x0400
#define NP_CARRAY (NP_C_CONTIGUOUS | NP_ALIGNED | NP_WRITEABLE)

/* ------------------------------------------------------------------ DLPack's layout (dlpack.h, v1) */
typedef struct {
    void *data;
    struct {
        int32_t device_type, device_id;
    } device;
    int32_t ndim;
    struct {
        uint8_t code, bits;
        uint16_t lanes;
    } dtype;
    int64_t *shape, *strides;
    uint64_t byte_offset;
} DlTensor;
typedef struct DlManaged { /* "dltensor" */
    DlTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DlManaged *);
} DlManaged;
typedef struct DlVersioned { /* "dltensor_versioned" */
    struct {
        uint32_t major, minor;
    } version;
    void *manager_ctx;
    void (*deleter)(struct DlVersioned *);
    uint64_t flags;
    DlTensor dl_tensor;
} DlVersioned;
/* DLPack's C exchange table (dlpack.h 1.3, ``DLPackExchangeAPI``): a producer's functions, in a capsule
 * "dlpack_exchange_api" that is its type's ``__dlpack_c_exchange_api__`` (torch.Tensor's in torch 2.13 and 2.14);
 * the table lives as long as the process. ``dltensor`` fills a caller's DLTensor with the tensor's own
 * data pointer, dtype, device and shape/strides arrays, nothing allocated nor held (NULL where the
 * producer has none); both return 0, or -1 with a Python exception set. */
typedef struct DlExchange {
    struct {
        uint32_t major, minor;
    } version;
    struct DlExchange *prev;
    void *allocator;
    int (*managed)(void *obj, DlVersioned **out);
    void *to_object;
    int (*dltensor)(void *obj, DlTensor *out);
    void *stream;
} DlExchange;
#define DL_CPU 1
#define DL_COMPLEX 5
#define DL_READ_ONLY 1ULL
#define NDLTYPES 16 /* DLPack (code, bits) -> the NumPy dtype ``np.from_dlpack`` / ``Tensor.numpy()`` give */
#define NBFTYPES 16 /* a buffer's struct format -> the NumPy dtype ``_convert.BUFFER_FORMATS`` gives */
#define NTYPES 8    /* argument types remembered by the lane (besides numpy.ndarray) */

/* ------------------------------------------------------------------ FastLane */
/* the ops it runs, in the order of ``rec_ops`` and KIND_NAMES */
enum { K_ALL_REDUCE, K_BROADCAST, K_ALL_TO_ALL, K_ALL_GATHER, K_REDUCE_SCATTER, K_BARRIER, NKINDS };
#define NREDOPS 9   /* wire codes 1..8 (PREMUL_SUM, 9, never runs here) */
#define NCACHE 24   /* dtypes remembered */

/* what ``describe(dtype)`` says of a dtype: its wire code, element size, the reduce ops the
 * repeated call may run on it here (bit r: wire code r) and whether it is one of the plain
 * dtypes (``_check.PLAIN_DTYPES``: broadcast, all_to_all_single); code 0: none of this */
typedef struct {
    PyObject *descr;
    int code, mask, plain;
    Py_ssize_t esize;
} DInfo;

/* What the C interface's calls (``nd_lane_call``, without the GIL) know of a dtype code: learnt
 * with the GIL on its first sight (``learn``: ``describe`` and the ring's index of the dtype),
 * then read without it. ``ready``: 0 not yet, CODE_TAKEN (the fields hold), CODE_NOT_TAKEN. */
#define NCODES 32
enum { CODE_TAKEN = 1, CODE_NOT_TAKEN };
typedef struct {
    atomic_int ready, mask, ridx;
} CodeInfo;

typedef struct {
    PyObject_HEAD
    LaneState *state;       /* the executor's flags (the claim's facts) */
    PyObject *group; /* the same-host Group, the TcpGroup or the TwoGroup */
    int kind, rank, size; /* kind: G_SHM, G_TCP or G_TWO */
    PyObject *wake;         /* Executor.wake */
    NdCounter *seqs;        /* the lane's counter (crecord.h) */
    NdRing *ring;           /* the flight recorder's ring (crecord.h), or NULL: no recording */
    int rec_idx[NKINDS], cpu_idx; /* the record's op of each kind and "cpu" in the ring's objects */
    PyObject *plain;        /* the group's Python lane: every case this one does not take */
    PyObject *failure;      /* failure(err, entry, seq): raises the op's error */
    PyObject *describe;     /* describe(dtype) -> (code, esize, mask, plain) */
    PyObject *ndarray;      /* numpy.ndarray */
    PyObject *group_rank;   /* global rank -> group rank */
    PyObject *redops[NREDOPS]; /* ReduceOp members by wire code */
    PyObject *rec_ops[NKINDS]; /* the record's op of each kind (K_*) */
    PyObject *cpu;          /* "cpu" */
    /* the readers of other array types (``read_arg``): DLPack dtypes; the argument types seen, by
     * address and version tag (no reference: a type freed and another made at its address has
     * another tag); torch's DLPack exchange table (its capsule, held, and the table: from the last
     * torch type classified) */
    struct {
        int key; /* code << 8 | bits */
        PyObject *descr;
    } dl[NDLTYPES];
    int ndl;
    struct {
        PyTypeObject *type;
        unsigned int tag;
        int kind;
    } types[NTYPES];
    int ntypes;
    PyObject *torch_api_cap, *torch_is_neg;
    const DlExchange *torch_api;
    /* buffer-protocol formats (``buffer_dtypes``): a format's key (its character; 'Z' and a
     * character: 0x80 | it) -> 1 + its index in ``bf`` (0: none) */
    unsigned char bf_index[256];
    struct {
        PyObject *descr;
        Py_ssize_t itemsize;
    } bf[NBFTYPES];
    int nbf;
    Py_ssize_t rsag_min;
    DInfo cache[NCACHE];
    int ncache;
    CodeInfo codes[NCODES]; /* by dtype code, for the C interface's calls */
    /* the last op this lane ran, for ``NativeAlgorithms.desc`` (``current()``): written by the
     * lane's claimant, with or without the GIL, read with it (a seqlock: ``cur_gen`` odd while
     * written; the fields relaxed atomics, LaneState says why) */
    atomic_uint cur_gen;
    _Atomic int cur_op, cur_code, cur_root, cur_redop;
    _Atomic Py_ssize_t cur_count;
    _Atomic unsigned long long cur_seq;
} FastLane;

static int FastLane_traverse(FastLane *f, visitproc visit, void *arg)
{
    Py_VISIT(f->state);
    Py_VISIT(f->group);
    Py_VISIT(f->wake);
    Py_VISIT(f->seqs);
    Py_VISIT(f->ring);
    Py_VISIT(f->plain);
    Py_VISIT(f->failure);
    Py_VISIT(f->describe);
    Py_VISIT(f->ndarray);
    Py_VISIT(f->group_rank);
    for (int i = 0; i < NREDOPS; i++)
        Py_VISIT(f->redops[i]);
    for (int i = 0; i < NKINDS; i++)
        Py_VISIT(f->rec_ops[i]);
    for (int i = 0; i < f->ncache; i++)
        Py_VISIT(f->cache[i].descr);
    for (int i = 0; i < f->ndl; i++)
        Py_VISIT(f->dl[i].descr);
    Py_VISIT(f->torch_api_cap);
    Py_VISIT(f->torch_is_neg);
    for (int i = 0; i < f->nbf; i++)
        Py_VISIT(f->bf[i].descr);
    return 0;
}

static int FastLane_clear(FastLane *f)
{
    Py_CLEAR(f->state);
    Py_CLEAR(f->group);
    Py_CLEAR(f->wake);
    Py_CLEAR(f->seqs);
    Py_CLEAR(f->ring);
    Py_CLEAR(f->plain);
    Py_CLEAR(f->failure);
    Py_CLEAR(f->describe);
    Py_CLEAR(f->ndarray);
    Py_CLEAR(f->group_rank);
    Py_CLEAR(f->cpu);
    for (int i = 0; i < NREDOPS; i++)
        Py_CLEAR(f->redops[i]);
    for (int i = 0; i < NKINDS; i++)
        Py_CLEAR(f->rec_ops[i]);
    for (int i = 0; i < f->ncache; i++)
        Py_CLEAR(f->cache[i].descr);
    f->ncache = 0;
    for (int i = 0; i < NCODES; i++)
        atomic_store(&f->codes[i].ready, 0);
    for (int i = 0; i < f->ndl; i++)
        Py_CLEAR(f->dl[i].descr);
    f->ndl = 0;
    f->ntypes = 0;
    Py_CLEAR(f->torch_api_cap);
    Py_CLEAR(f->torch_is_neg);
    f->torch_api = NULL;
    for (int i = 0; i < f->nbf; i++)
        Py_CLEAR(f->bf[i].descr);
    f->nbf = 0;
    memset(f->bf_index, 0, sizeof f->bf_index);
    return 0;
}

static void FastLane_dealloc(FastLane *f)
{
    PyObject_GC_UnTrack(f);
    FastLane_clear(f);
    Py_TYPE(f)->tp_free((PyObject *)f);
}

/* FastLane(state, group, executor, seqs, ring, plain, failure, describe,
 *          ndarray, group_rank, redops, rec_ops, rsag_min, t_done, probe, probe_data): ``seqs`` the
 * lane's ``Counter``, ``ring`` the flight recorder's ``Ring`` or None (no recording), ``t_done``
 * _debug.T_DONE (checked against the entry crecord.c makes) */
static int FastLane_init(FastLane *f, PyObject *args, PyObject *kw)
{
    PyObject *state, *group, *executor, *seqs, *ring, *plain, *failure, *describe, *ndarray, *group_rank, *redops,
        *rec_ops, *probe;
    Py_ssize_t rsag_min, probe_data;
    int t_done;
    if (!PyArg_ParseTuple(args, "O!OOO!OOOOO!O!O!O!niOn:FastLane", &LaneStateType, &state, &group, &executor,
                          &NdCounterType, &seqs, &ring, &plain, &failure, &describe, &PyType_Type,
                          &ndarray, &PyDict_Type, &group_rank, &PyTuple_Type, &redops, &PyTuple_Type, &rec_ops,
                          &rsag_min, &t_done, &probe, &probe_data))
        return -1;
    FastLane_clear(f);
    if (nd_tcp_is(group)) {
        f->kind = G_TCP;
        nd_tcp_geometry(group, &f->rank, &f->size);
    } else if (nd_shm_is(group)) {
        f->kind = G_SHM;
        nd_shm_geometry(group, &f->rank, &f->size);
    } else if (nd_two_is(group)) {
        f->kind = G_TWO;
        nd_two_geometry(group, &f->rank, &f->size);
    } else {
        PyErr_Format(PyExc_TypeError, "FastLane: group: expected a _cnative.Group, TcpGroup or TwoGroup, got %s",
                     Py_TYPE(group)->tp_name);
        return -1;
    }
    if (PyTuple_GET_SIZE(redops) != NREDOPS || PyTuple_GET_SIZE(rec_ops) != NKINDS) {
        PyErr_SetString(PyExc_ValueError, "FastLane: redops: expected 9 entries, rec_ops 6");
        return -1;
    }
    if (!PyCallable_Check(failure) || !PyCallable_Check(describe) ||
        (ring != Py_None && Py_TYPE(ring) != &NdRingType)) {
        PyErr_SetString(PyExc_TypeError, "FastLane: failure and describe must be callable, ring a Ring or None");
        return -1;
    }
    if (t_done != RF_T_DONE) {
        PyErr_Format(PyExc_ValueError, "FastLane: t_done: expected %d (the entry crecord.c makes), got %d",
                     RF_T_DONE, t_done);
        return -1;
    }
    /* NumPy's layout, checked on a 1-D float32 array of 3 elements, C-contiguous and writable */
    NpArray *p = (NpArray *)probe;
    if ((PyObject *)Py_TYPE(probe) != ndarray || p->data != (char *)probe_data || p->nd != 1 ||
        p->dimensions[0] != 3 || p->strides[0] != 4 || (p->flags & NP_CARRAY) != NP_CARRAY) {
        PyErr_SetString(PyExc_ValueError, "FastLane: NumPy's array layout is not the one this module reads");
        return -1;
    }
    if (!(f->wake = PyObject_GetAttrString(executor, "wake")))
        return -1;
    f->state = (LaneState *)Py_NewRef(state);
    f->group = Py_NewRef(group);
    f->seqs = (NdCounter *)Py_NewRef(seqs);
    f->ring = ring == Py_None ? NULL : (NdRing *)Py_NewRef(ring);
    f->plain = Py_NewRef(plain);
    f->failure = Py_NewRef(failure);
    f->describe = Py_NewRef(describe);
    f->ndarray = Py_NewRef(ndarray);
    f->group_rank = Py_NewRef(group_rank);
    for (int i = 0; i < NREDOPS; i++)
        f->redops[i] = Py_NewRef(PyTuple_GET_ITEM(redops, i));
    for (int i = 0; i < NKINDS; i++)
        f->rec_ops[i] = Py_NewRef(PyTuple_GET_ITEM(rec_ops, i));
    if (!(f->cpu = PyUnicode_InternFromString("cpu")))
        return -1;
    if (f->ring) {
        for (int i = 0; i < NKINDS; i++)
            if ((f->rec_idx[i] = nd_ring_intern(f->ring, f->rec_ops[i])) < 0)
                return -1;
        if ((f->cpu_idx = nd_ring_intern(f->ring, f->cpu)) < 0)
            return -1;
    }
    f->rsag_min = rsag_min;
    return 0;
}

/* the dtype's DInfo (asking ``describe`` on a first sight), or NULL with an error set */
static DInfo *dinfo(FastLane *f, PyObject *descr)
{
    for (int i = 0; i < f->ncache; i++)
        if (f->cache[i].descr == descr)
            return &f->cache[i];
    PyObject *r = PyObject_CallOneArg(f->describe, descr);
    if (!r)
        return NULL;
    int code, mask, plain;
    Py_ssize_t esize;
    if (!PyArg_ParseTuple(r, "inii:describe", &code, &esize, &mask, &plain)) {
        Py_DECREF(r);
        return NULL;
    }
    Py_DECREF(r);
    static DInfo none = {NULL, 0, 0, 0, 0};
    if (f->ncache == NCACHE)
        return &none; /* (a program of more than 24 dtypes: the rest go through Python) */
    DInfo *d = &f->cache[f->ncache++];
    *d = (DInfo){Py_NewRef(descr), code, mask, plain, esize};
    return d;
}

/* The plain lane's method ``name`` with the call's own arguments */
static PyObject *delegate(FastLane *f, const char *name, PyObject *const *args, Py_ssize_t nargs)
{
    if (f->plain == Py_None) /* (the C interface's core: no Python lane; the general path takes it) */
        Py_RETURN_FALSE;
    PyObject *m = PyObject_GetAttrString(f->plain, name);
    if (!m)
        return NULL;
    PyObject *r = PyObject_Vectorcall(m, args, nargs, NULL);
    Py_DECREF(m);
    return r;
}

/* ------------------------------------------------------------------ the arguments */
/* One buffer argument as the ops read it (``read_arg``): its memory, its NumPy dtype (borrowed: the
 * array's, or the one ``np.from_dlpack`` / ``Tensor.numpy()`` give), its shape, NumPy's flags
 * (NP_C_CONTIGUOUS, NP_ALIGNED, NP_WRITEABLE, as the Python path's view would have them) and
 * what ``release_arg`` ends after the call: a reference (an ndist.Tensor's array, a DLPack
 * capsule), a DLPack tensor (its deleter) and a buffer (``view``, when its ``obj`` is set).
 * Nothing outlives the call. */
typedef struct {
    char *data;
    PyObject *descr;
    int nd, flags;
    const Py_ssize_t *np_dims; /* NumPy's dimensions (or a buffer's shape), or NULL and */
    const int64_t *dl_dims;    /* DLPack's */
    Py_ssize_t count;
    PyObject *hold;
    void *managed;
    int versioned, dl_code;
    Py_buffer view;
} Arg;

enum { A_NONE, A_NUMPY, A_NDIST, A_TORCH, A_DLPACK, A_BUFFER }; /* how an argument type is read */

static PyObject *s_data, *s_is_neg, *s_is_conj, *s_dlpack, *s_dlpack_device, *s_module, *s_Tensor, *s_nn,
    *s_Parameter, *s_exchange, *s_ndist_tensor, *s_torch, *s_cupy, *dl_kwnames, *dl_args_tail,
    *s_array_interface, *s_array_struct, *s_cuda_array_interface;

static inline Py_ssize_t arg_dim(const Arg *a, int k)
{
    return a->np_dims ? a->np_dims[k] : (Py_ssize_t)a->dl_dims[k];
}

static inline void numpy_arg(Arg *a, PyObject *t)
{
    NpArray *p = (NpArray *)t;
    Py_ssize_t count = 1;
    for (int i = 0; i < p->nd; i++)
        count *= p->dimensions[i];
    a->data = p->data, a->descr = p->descr, a->nd = p->nd, a->flags = p->flags, a->np_dims = p->dimensions;
    a->count = count;
}

/* an argument's memory let go: the DLPack tensor's deleter, then the reference (an error being
 * raised is kept: a deleter may run Python code) */
static void release_arg(Arg *a)
{
    if (!a->managed && !a->hold && !a->view.obj)
        return;
    PyObject *type = NULL, *value = NULL, *tb = NULL;
    int raising = PyErr_Occurred() != NULL; /* (none: nothing to keep, what the deleter leaves is cleared) */
    if (raising)
        PyErr_Fetch(&type, &value, &tb);
    if (a->managed) {
        if (a->versioned) {
            DlVersioned *v = a->managed;
            if (v->deleter)
                v->deleter(v);
        } else {
            DlManaged *m = a->managed;
            if (m->deleter)
                m->deleter(m);
        }
        a->managed = NULL;
    }
    Py_CLEAR(a->hold);
    if (a->view.obj)
        PyBuffer_Release(&a->view); /* (sets view.obj to NULL) */
    if (raising)
        PyErr_Restore(type, value, tb);
    else if (PyErr_Occurred())
        PyErr_Clear();
}

/* an exception of the array's own (export refused, no such attribute): 0, the Python path raises
 * its own; anything else (KeyboardInterrupt, MemoryError...): -1 */
static int refused(void)
{
    if (!PyErr_ExceptionMatches(PyExc_Exception) || PyErr_ExceptionMatches(PyExc_MemoryError))
        return -1;
    PyErr_Clear();
    return 0;
}

/* ``tp``'s attribute ``name`` is ``want`` (errors: not) */
static int type_attr_is(PyObject *owner, PyObject *name, PyObject *want)
{
    PyObject *v = PyObject_GetAttr(owner, name);
    if (!v) {
        PyErr_Clear();
        return 0;
    }
    int is = v == want;
    Py_DECREF(v);
    return is;
}

/* A_BUFFER when ``_convert.as_array`` reads an instance of ``tp`` through the buffer protocol
 * (classify's last question: no DLPack export): ``tp`` exports it and has neither array
 * interface, asked of the type, which answers for the instance only when the instance can have
 * no attribute of its own (no instance dict, the generic attribute lookup): a memoryview, a
 * bytearray, an array.array, an mmap. Other exporters go to the Python lane. */
static int buffer_kind(PyTypeObject *tp)
{
    if (!tp->tp_as_buffer || !tp->tp_as_buffer->bf_getbuffer || tp->tp_dictoffset != 0 ||
        tp->tp_getattro != PyObject_GenericGetAttr)
        return A_NONE;
#ifdef Py_TPFLAGS_MANAGED_DICT
    if (PyType_HasFeature(tp, Py_TPFLAGS_MANAGED_DICT))
        return A_NONE;
#endif
    PyObject *o = (PyObject *)tp;
    if (PyObject_HasAttr(o, s_array_interface) || PyObject_HasAttr(o, s_array_struct) ||
        PyObject_HasAttr(o, s_cuda_array_interface))
        return A_NONE;
    return A_BUFFER;
}

/* torch's DLPack exchange table, looked up on the type ``tp`` as DLPack says (each time a torch type
 * is classified: a type whose attribute changed has another version tag) and kept in ``f`` with
 * the type's ``is_neg`` (called as the method it is, without a lookup per call): 1; 0: none that
 * this lane reads (no attribute, not a capsule of that name, another major version, no
 * ``managed``, ``is_neg`` not a method descriptor), the Python lane; -1: an error */
static int torch_table(FastLane *f, PyTypeObject *tp)
{
    PyObject *neg = PyObject_GetAttr((PyObject *)tp, s_is_neg);
    if (!neg)
        return refused();
    if (!PyObject_TypeCheck(neg, &PyMethodDescr_Type)) {
        Py_DECREF(neg);
        return 0;
    }
    Py_XSETREF(f->torch_is_neg, neg);
    PyObject *cap = PyObject_GetAttr((PyObject *)tp, s_exchange);
    if (!cap)
        return refused();
    const DlExchange *api = NULL;
    if (PyCapsule_IsValid(cap, "dlpack_exchange_api"))
        for (api = PyCapsule_GetPointer(cap, "dlpack_exchange_api"); api && api->version.major > 1; api = api->prev)
            ;
    if (!api || api->version.major != 1 || !api->managed) {
        Py_DECREF(cap);
        return 0;
    }
    Py_XSETREF(f->torch_api_cap, cap);
    f->torch_api = api;
    return 1;
}

/* how ``_convert.as_array`` would read an instance of ``tp``, as far as this lane takes it: the
 * order of its tests (ndarray, ndist.Tensor, a torch module's, a CuPy module's, a builtin,
 * ``__dlpack__`` and ``__dlpack_device__``). Never imports: a module not loaded has no instances. */
static int classify(FastLane *f, PyTypeObject *tp)
{
    if (PyType_IsSubtype(tp, (PyTypeObject *)f->ndarray))
        return A_NUMPY;
    PyObject *m = PyImport_GetModule(s_ndist_tensor);
    if (m) {
        PyObject *T = PyObject_GetAttr(m, s_Tensor);
        Py_DECREF(m);
        if (!T)
            return refused() < 0 ? -1 : A_NONE;
        int exact = (PyObject *)tp == T, sub = PyType_Check(T) && PyType_IsSubtype(tp, (PyTypeObject *)T);
        Py_DECREF(T);
        if (exact)
            return A_NDIST;
        if (sub) /* (a subclass: the Python lane) */
            return A_NONE;
    } else if (PyErr_Occurred())
        return -1;
    PyObject *mod = PyObject_GetAttr((PyObject *)tp, s_module);
    if (!mod)
        return refused() < 0 ? -1 : A_NONE;
    int torch = 0, cupy = 0;
    if (PyUnicode_Check(mod)) {
        torch = PyUnicode_Tailmatch(mod, s_torch, 0, PY_SSIZE_T_MAX, -1) == 1;
        cupy = PyUnicode_Tailmatch(mod, s_cupy, 0, PY_SSIZE_T_MAX, -1) == 1;
    }
    Py_DECREF(mod);
    if (PyErr_Occurred())
        return -1;
    if (torch) { /* torch.Tensor and torch.nn.Parameter; another subclass may dispatch: the Python lane */
        PyObject *tm = PyImport_GetModule(s_torch);
        if (!tm)
            return PyErr_Occurred() ? -1 : A_NONE;
        int kind = A_NONE;
        PyObject *nn = PyObject_GetAttr(tm, s_nn);
        if (!nn)
            PyErr_Clear();
        if (type_attr_is(tm, s_Tensor, (PyObject *)tp) || (nn && type_attr_is(nn, s_Parameter, (PyObject *)tp)))
            kind = A_TORCH;
        Py_XDECREF(nn);
        Py_DECREF(tm);
        if (kind == A_TORCH && torch_table(f, tp) <= 0) /* (none: the Python lane) */
            kind = PyErr_Occurred() ? -1 : A_NONE;
        return kind;
    }
    if (cupy || PyType_FastSubclass(tp, Py_TPFLAGS_LIST_SUBCLASS | Py_TPFLAGS_TUPLE_SUBCLASS |
                                            Py_TPFLAGS_DICT_SUBCLASS | Py_TPFLAGS_UNICODE_SUBCLASS |
                                            Py_TPFLAGS_BYTES_SUBCLASS | Py_TPFLAGS_LONG_SUBCLASS) ||
        PyType_IsSubtype(tp, &PyFloat_Type) || PyType_IsSubtype(tp, &PyComplex_Type))
        return A_NONE;
    int has = PyObject_HasAttr((PyObject *)tp, s_dlpack) && PyObject_HasAttr((PyObject *)tp, s_dlpack_device);
    return has ? A_DLPACK : buffer_kind(tp);
}

/* a DLPack tensor ``dt`` into ``a`` as the Python path's view would be (its memory, NumPy dtype,
 * shape, flags; what holds it is the caller's): 1; 0: not this lane's (another device, a dtype
 * not in the table, vector lanes) */
static int dl_view(FastLane *f, Arg *a, const DlTensor *dt, int writable)
{
    if (dt->device.device_type != DL_CPU || dt->dtype.lanes != 1 || dt->ndim < 0)
        return 0;
    int key = dt->dtype.code << 8 | dt->dtype.bits;
    a->descr = NULL;
    for (int i = 0; i < f->ndl; i++)
        if (f->dl[i].key == key) {
            a->descr = f->dl[i].descr;
            break;
        }
    if (!a->descr)
        return 0;
    Py_ssize_t count = 1, want = 1;
    int contiguous = 1;
    for (int k = dt->ndim - 1; k >= 0; k--) { /* NumPy's C-contiguity: dimensions of 1 have any stride */
        int64_t n = dt->shape[k];
        if (dt->strides && n != 1 && dt->strides[k] != want)
            contiguous = 0;
        want *= n;
        count *= n;
    }
    int esize = dt->dtype.bits / 8, align = dt->dtype.code == DL_COMPLEX ? esize / 2 : esize;
    a->data = (char *)dt->data + dt->byte_offset;
    a->nd = dt->ndim, a->np_dims = NULL, a->dl_dims = dt->shape, a->count = count, a->dl_code = dt->dtype.code;
    a->flags = (contiguous ? NP_C_CONTIGUOUS : 0) | (writable ? NP_WRITEABLE : 0) |
               (align > 0 && (uintptr_t)a->data % align == 0 ? NP_ALIGNED : 0);
    return 1;
}

/* a DLPack capsule's tensor into ``a`` (the capsule consumed: renamed, its deleter called by
 * ``release_arg``), writable as ``np.from_dlpack`` makes it: a versioned capsule's read-only flag,
 * a legacy one read-only. 1: read; 0: not this lane's (released) */
static int dl_arg(FastLane *f, Arg *a, PyObject *cap)
{
    DlTensor *dt;
    int writable;
    a->hold = cap;
    if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        DlVersioned *v = PyCapsule_GetPointer(cap, "dltensor_versioned");
        if (PyCapsule_SetName(cap, "used_dltensor_versioned") < 0) { /* (not on a valid capsule) */
            int r = refused();
            release_arg(a);
            return r;
        }
        a->managed = v, a->versioned = 1;
        if (v->version.major != 1) /* another layout: only the deleter may be used */
            goto no;
        if (v->flags & ~DL_READ_ONLY) /* a copy (IS_COPIED), a padded sub-byte type, a flag not known */
            goto no;
        dt = &v->dl_tensor;
        writable = !(v->flags & DL_READ_ONLY);
    } else if (PyCapsule_IsValid(cap, "dltensor")) {
        DlManaged *m = PyCapsule_GetPointer(cap, "dltensor");
        if (PyCapsule_SetName(cap, "used_dltensor") < 0) { /* (not on a valid capsule) */
            int r = refused();
            release_arg(a);
            return r;
        }
        a->managed = m, a->versioned = 0;
        dt = &m->dl_tensor;
        writable = 0;
    } else
        goto no;
    if (dl_view(f, a, dt, writable))
        return 1;
no:
    release_arg(a);
    return 0;
}

/* A buffer-protocol object read into ``a`` as ``_convert._from_buffer`` views it: the buffer
 * asked once (strides and format, writable or not), held in ``a->view`` until ``release_arg``;
 * its dtype from its format (``bf``: one character after an optional '@', '=' or the machine's
 * own order, or 'Z' and one), when the dtype's item size is the buffer's (else the Python path
 * decides: struct's standard sizes, an exporter's own); C-contiguous by NumPy's rule, aligned
 * to its element (complex: half of it), writable unless read-only. 1: read; 0: not this lane's
 * (released) */
static int buf_arg(FastLane *f, PyObject *t, Arg *a)
{
    Py_buffer *v = &a->view;
    if (PyObject_GetBuffer(t, v, PyBUF_RECORDS_RO) < 0)
        return refused();
    const unsigned char *p = (const unsigned char *)(v->format ? v->format : "B");
    if (*p == '@' || *p == '=' || *p == (PY_LITTLE_ENDIAN ? '<' : '>'))
        p++;
    int key = -1, cplx = p[0] == 'Z';
    if (cplx ? p[1] && p[1] < 0x80 && !p[2] : p[0] && p[0] < 0x80 && !p[1])
        key = cplx ? 0x80 | p[1] : p[0];
    int at = key < 0 ? 0 : f->bf_index[key];
    if (!at || f->bf[at - 1].itemsize != v->itemsize) {
        release_arg(a);
        return 0;
    }
    Py_ssize_t count = 1, esize = v->itemsize;
    for (int k = 0; k < v->ndim; k++)
        count *= v->shape[k];
    Py_ssize_t align = cplx ? esize / 2 : esize;
    a->data = v->buf, a->descr = f->bf[at - 1].descr, a->nd = v->ndim, a->np_dims = v->shape, a->count = count;
    a->flags = (PyBuffer_IsContiguous(v, 'C') ? NP_C_CONTIGUOUS : 0) | (v->readonly ? 0 : NP_WRITEABLE) |
               (align > 0 && (uintptr_t)a->data % align == 0 ? NP_ALIGNED : 0);
    return 1;
}

/* ``t`` read into ``a`` (zeroed by the caller): 1; 0: the Python lane takes it (nothing held);
 * -1: an error. */
static int read_other(FastLane *f, PyObject *t, Arg *a)
{
    PyTypeObject *tp = Py_TYPE(t);
    int kind = -1, slot = -1;
    for (int i = 0; i < f->ntypes; i++)
        if (f->types[i].type == tp) {
            slot = i;
            if (PyType_HasFeature(tp, Py_TPFLAGS_VALID_VERSION_TAG) && tp->tp_version_tag == f->types[i].tag)
                kind = f->types[i].kind;
            break;
        }
    if (kind < 0) {
        if ((kind = classify(f, tp)) < 0)
            return -1;
        if (slot < 0 && f->ntypes < NTYPES)
            slot = f->ntypes++;
        if (slot >= 0) {
            if (PyType_HasFeature(tp, Py_TPFLAGS_VALID_VERSION_TAG))
                f->types[slot].type = tp, f->types[slot].tag = tp->tp_version_tag, f->types[slot].kind = kind;
            else
                f->types[slot].type = NULL;
        }
    }
    switch (kind) {
    case A_NUMPY:
        numpy_arg(a, t);
        return 1;
    case A_NDIST: { /* its array, held for the call */
        PyObject *d = PyObject_GetAttr(t, s_data);
        if (!d)
            return refused();
        if ((PyObject *)Py_TYPE(d) != f->ndarray) {
            Py_DECREF(d);
            return 0;
        }
        numpy_arg(a, d);
        a->hold = d;
        return 1;
    }
    case A_TORCH: { /* torch's exchange table (no Python frame, no capsule), then the bits Tensor.numpy()
                     * refuses; writable whatever DLPack says, as Tensor.numpy()'s view is */
        PyObject *neg = PyObject_Vectorcall(f->torch_is_neg, &t, 1, NULL);
        if (!neg)
            return refused();
        Py_DECREF(neg);
        if (neg != Py_False)
            return 0;
        DlVersioned *v = NULL;
        if (f->torch_api->managed(t, &v) < 0)
            return refused();
        if (!v)
            return 0;
        a->managed = v, a->versioned = 1; /* (its deleter: release_arg) */
        int r = v->version.major == 1 && !(v->flags & ~DL_READ_ONLY) && dl_view(f, a, &v->dl_tensor, 1);
        if (!r)
            release_arg(a);
        if (r > 0 && a->dl_code == DL_COMPLEX) { /* a conjugate view: Tensor.numpy() refuses it */
            PyObject *conj = PyObject_CallMethodNoArgs(t, s_is_conj);
            if (!conj) {
                release_arg(a);
                return refused();
            }
            Py_DECREF(conj);
            if (conj != Py_False) {
                release_arg(a);
                return 0;
            }
        }
        return r;
    }
    case A_DLPACK: { /* as _convert.as_array asks: __dlpack_device__() first (CPU: 1, else another library's
                      * path), then as np.from_dlpack: __dlpack__(dl_device=None, copy=None, max_version=(1, 0)) */
        PyObject *dev = PyObject_CallMethodNoArgs(t, s_dlpack_device);
        if (!dev)
            return refused();
        int cpu = PyTuple_Check(dev) && PyTuple_GET_SIZE(dev) >= 1 && PyLong_Check(PyTuple_GET_ITEM(dev, 0)) &&
                  PyLong_AsLong(PyTuple_GET_ITEM(dev, 0)) == DL_CPU;
        Py_DECREF(dev);
        if (!cpu)
            return PyErr_Occurred() ? refused() : 0;
        PyObject *argv[4] = {t, PyTuple_GET_ITEM(dl_args_tail, 0), PyTuple_GET_ITEM(dl_args_tail, 1),
                             PyTuple_GET_ITEM(dl_args_tail, 2)};
        PyObject *cap = PyObject_VectorcallMethod(s_dlpack, argv, 1, dl_kwnames);
        if (!cap)
            return refused();
        return dl_arg(f, a, cap);
    }
    case A_BUFFER:
        return buf_arg(f, t, a);
    }
    return 0;
}

/* one buffer argument, ``numpy.ndarray`` first */
static inline int read_arg(FastLane *f, PyObject *t, Arg *a)
{
    if ((PyObject *)Py_TYPE(t) == f->ndarray) {
        numpy_arg(a, t);
        return 1;
    }
    return read_other(f, t, a);
}

/* the Python lane, once the argument is let go */
static PyObject *pass_on(FastLane *f, Arg *a, const char *name, PyObject *const *args, Py_ssize_t nargs)
{
    release_arg(a);
    return delegate(f, name, args, nargs);
}

/* The flag cleared, and the worker (or a thread in ``Executor.drain``) woken when a job was queued
 * meanwhile (or it waits) (Executor.leave; LaneState says why this order): with the GIL (``ts``
 * NULL) or without it (``ts``: this thread's state; the GIL is taken for the wake only).
 * A FastLane method's (``table`` 0, with the GIL): 0, or -1 with the wake's error set, which the
 * method raises after its op ran, as Executor.leave raises it on the Python path.
 * A C interface call's (``table`` 1): 0. The call's status is its op's (NDIST_OK: the result is
 * valid): a wake that fails is not the op's failure. Its error goes to sys.unraisablehook
 * (PyErr_WriteUnraisable, as the engines' stall notices' do) and the worker is woken once more,
 * so that a one-off failure (a MemoryError, an exception sent to the thread) strands no queued
 * job; after a second failure it waits for the group's next op, whose submit wakes it. */
static int leave(FastLane *f, PyThreadState *ts, int table)
{
    atomic_store(&f->state->busy, 0);
    if (atomic_load(&f->state->queued) == 0 && atomic_load(&f->state->drainers) == 0)
        return 0;
    PyGILState_STATE st = PyGILState_UNLOCKED;
    if (ts)
        st = PyGILState_Ensure();
    PyObject *r = PyObject_CallNoArgs(f->wake);
    if (!r && table) {
        PyErr_WriteUnraisable(f->wake);
        if (!(r = PyObject_CallNoArgs(f->wake)))
            PyErr_WriteUnraisable(f->wake);
    }
    int rc = r || table ? 0 : -1;
    Py_XDECREF(r);
    if (ts)
        PyGILState_Release(st);
    return rc;
}

/* The busy flag, when the backend is open, nothing is queued and the group has no failure, read
 * from ``LaneState`` (C11 atomics: no GIL needed; its comment says why this order keeps the
 * executor's): 1 (claimed), 0 (not: the Python path takes the call), -1 (a broken group's flag let
 * go, and the wake that needed failed: as ``leave``, whose ``table`` this is). */
static int claim_lane(FastLane *f, PyThreadState *ts, int table)
{
    LaneState *s = f->state;
    if (atomic_load(&s->closed) || atomic_load(&s->queued) != 0)
        return 0;
    int zero = 0;
    if (!atomic_compare_exchange_strong(&s->busy, &zero, 1))
        return 0;
    if (atomic_load(&s->broken)) /* the first failure, raised again by the Python path */
        return leave(f, ts, table) < 0 ? -1 : 0;
    return 1;
}

/* the claim of a FastLane method (with the GIL) */
static inline int claim(FastLane *f) { return claim_lane(f, NULL, 0); }

/* AVG's finish on ``count`` elements of wire dtype ``code`` (the codes ``describe`` allows) */
#define TRUNC_DIV(T)                                                                                           \
    do {                                                                                                       \
        T *x = (T *)buf;                                                                                       \
        for (Py_ssize_t i = 0; i < count; i++)                                                                 \
            x[i] = (T)((int64_t)x[i] / (int64_t)n);                                                            \
    } while (0)

static void avg_finish(char *buf, Py_ssize_t count, int code, int n)
{
    switch (code) {
    case 2: TRUNC_DIV(int8_t); break;
    case 3: TRUNC_DIV(uint8_t); break;
    case 4: TRUNC_DIV(int16_t); break;
    case 5: TRUNC_DIV(uint16_t); break;
    case 6: TRUNC_DIV(int32_t); break;
    case 7: TRUNC_DIV(uint32_t); break;
    case 8: {
        int64_t *x = (int64_t *)buf;
        for (Py_ssize_t i = 0; i < count; i++)
            x[i] = x[i] / (int64_t)n;
        break;
    }
    case 11: {
        float *x = (float *)buf, d = (float)n;
        for (Py_ssize_t i = 0; i < count; i++)
            x[i] = x[i] / d;
        break;
    }
    case 12: {
        double *x = (double *)buf, d = (double)n;
        for (Py_ssize_t i = 0; i < count; i++)
            x[i] = x[i] / d;
        break;
    }
    }
}

/* the last op this lane ran, for ``current()`` (the lane's claimant writes it: one writer at a time) */
static inline void set_current(FastLane *f, int kind, int code, Py_ssize_t count, unsigned long long seq, int root,
                               int redop)
{
    unsigned g = atomic_load_explicit(&f->cur_gen, memory_order_relaxed);
    atomic_store_explicit(&f->cur_gen, g + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    ND_SET(f->cur_op, kind), ND_SET(f->cur_code, code), ND_SET(f->cur_count, count), ND_SET(f->cur_seq, seq);
    ND_SET(f->cur_root, root), ND_SET(f->cur_redop, redop);
    atomic_store_explicit(&f->cur_gen, g + 2, memory_order_release);
}

/* The C core of one claimed op (``claim`` took the flag), shared by FastLane's methods (``run``)
 * and the C interface (``nd_lane_call``, for capi.c): numbered, recorded, run without the GIL,
 * AVG finished, the entry's end time, the claim ended. It touches no Python object: the counter,
 * the ring (crecord.h) and LaneState are C11 atomics, the op described in the lane's own fields
 * (``current()``), so it runs with the GIL (``ts`` NULL: released around the op) or without it
 * (``ts``: this thread's state, which the engine restores for a moment to call back into Python,
 * as it does the caller's; ``leave`` takes the GIL to wake the worker). ``di``: the dtype's index
 * in the ring's objects (0 for none); ``table``: a C interface call's (``leave``).
 * 0: done. -1: the wake failed after the op ran (a FastLane method's: its error set). 1: the op
 * failed: ``out`` holds the engine's code, the entry and the number, and the claim is still held:
 * the caller takes the GIL, ``nd_lane_failed`` gives the exception, and its hook maps the failure,
 * ends the claim and records it (``_fast.py``'s ``failure``, ``_capi.py``'s ``Handle.failure``).
 * The record's root is ``op->root`` (a group rank) for a broadcast. */
/* (inlined into both callers: a FastLane method's call costs what it did as one function) */
static inline __attribute__((always_inline)) int core(FastLane *f, int kind, NdOp *op, Py_ssize_t count_in,
                                                      Py_ssize_t count_out, int di, int redop, PyThreadState *ts,
                                                      int table, NdLaneOut *out)
{
    /* the lane's number and the flight recorder's entry, in C (crecord.h): no Python object */
    unsigned long long seq = nd_counter_next(f->seqs);
    uint64_t slot = 0;
    if (f->ring)
        slot = nd_ring_issue(f->ring, seq, f->rec_idx[kind], f->cpu_idx, di, count_in, count_out,
                             kind == K_BROADCAST ? op->root : -1);
    /* the backend's number for the op (Executor.claim), the op described for messages */
    unsigned long long bseq = atomic_fetch_add(&f->state->seq, 1) + 1;
    nd_group_set_seq(f->kind, f->group, bseq);
    /* (the count Python's lanes name: all_to_all and all_gather the input's, the others the output's) */
    set_current(f, kind, op->dtype, kind == K_ALL_TO_ALL || kind == K_ALL_GATHER ? count_in : count_out, bseq,
                op->root, redop);

    PyThreadState *save = ts ? ts : PyEval_SaveThread();
    int rc = nd_group_run(f->kind, f->group, op, &save);
    if (!ts)
        PyEval_RestoreThread(save);
    if (rc) { /* the group's error, for the caller's hook to map */
        out->rc = rc, out->slot = slot, out->seq = seq;
        return 1;
    }
    if (redop == 5) /* AVG */
        avg_finish(op->out, count_out, op->dtype, f->size);
    if (f->ring)
        nd_ring_done(f->ring, slot);
    return leave(f, ts, table);
}

/* With the GIL, after ``core`` returned 1: the group's exception (``*exc``), the recorder's entry
 * (``*entry``, made a list, which stays the ring's: what the hook marks shows there; NULL when
 * newer entries pushed it out) and the lane's number (``*seq``), new references, as the failure
 * hook takes them. */
void nd_lane_failed(PyObject *lane, const NdLaneOut *out, PyObject **exc_p, PyObject **entry_p, PyObject **seq_p)
{
    FastLane *f = (FastLane *)lane;
    PyObject *value = nd_group_exception(f->kind, f->group, out->rc);
    PyObject *seq_obj = PyLong_FromUnsignedLongLong(out->seq);
    PyObject *entry = f->ring ? nd_ring_entry(f->ring, out->slot) : NULL;
    if (!seq_obj)
        seq_obj = Py_NewRef(Py_None);
    if (PyErr_Occurred()) /* (out of memory: the hook still runs, without the entry) */
        PyErr_Clear();
    *exc_p = value, *entry_p = entry, *seq_p = seq_obj;
}

/* One claimed op of a FastLane method (with the GIL): ``core``; a failure goes to the hook
 * ``failure(err, entry, seq)``, which ends the claim and raises what the Python path raises.
 * Returns Py_True, or NULL with that error set. */
static PyObject *run(FastLane *f, int kind, NdOp *op, Py_ssize_t count_in, Py_ssize_t count_out, PyObject *descr,
                     int redop)
{
    int di = f->ring && descr ? nd_ring_index(f->ring, descr) : 0; /* (a dtype's first sight: interned) */
    if (di < 0) { /* before the op: nothing ran; the claim ends (its error kept) */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (leave(f, NULL, 0) < 0)
            PyErr_Clear();
        PyErr_Restore(type, value, tb);
        return NULL;
    }
    NdLaneOut out;
    int rc = core(f, kind, op, count_in, count_out, di, redop, NULL, 0, &out);
    if (rc == 0)
        Py_RETURN_TRUE;
    if (rc < 0)
        return NULL;
    PyObject *entry, *seq, *exc;
    nd_lane_failed((PyObject *)f, &out, &exc, &entry, &seq);
    PyObject *r = PyObject_CallFunctionObjArgs(f->failure, exc ? exc : Py_None, entry ? entry : Py_None, seq, NULL);
    Py_XDECREF(exc);
    Py_XDECREF(entry);
    Py_DECREF(seq);
    if (r) { /* (it raises) */
        Py_DECREF(r);
        PyErr_SetString(PyExc_RuntimeError, "FastLane: the failure hook returned");
    }
    return NULL;
}

/* with the GIL: what the C interface's calls need of dtype code ``code`` (``dtypes``: NumPy's dtype
 * of each code, None where there is none), learnt once per lane: CODE_TAKEN (a dtype ``describe``
 * takes, its reduce ops and its index in the ring), CODE_NOT_TAKEN, or -1 with an error set */
static int learn(FastLane *f, int code, PyObject *dtypes)
{
    CodeInfo *c = &f->codes[code];
    int ready = atomic_load_explicit(&c->ready, memory_order_acquire);
    if (ready) /* (another thread's first sight, meanwhile) */
        return ready;
    PyObject *descr = code < PyTuple_GET_SIZE(dtypes) ? PyTuple_GET_ITEM(dtypes, code) : Py_None;
    ready = CODE_NOT_TAKEN;
    if (descr != Py_None) {
        DInfo *d = dinfo(f, descr);
        if (!d)
            return -1;
        if (d->code == code && d->plain) {
            int ridx = f->ring ? nd_ring_index(f->ring, descr) : 0;
            if (ridx < 0)
                return -1;
            atomic_store_explicit(&c->mask, d->mask, memory_order_relaxed);
            atomic_store_explicit(&c->ridx, ridx, memory_order_relaxed);
            ready = CODE_TAKEN;
        }
    }
    atomic_store_explicit(&c->ready, ready, memory_order_release);
    return ready;
}

/* capi.c's call on the group's C core (engines.h), with the GIL (``ts`` NULL) or without */
int nd_lane_call(PyObject *lane, NdOp *op, Py_ssize_t count_in, Py_ssize_t count_out, PyObject *dtypes,
                 PyThreadState *ts, NdLaneOut *out)
{
    FastLane *f = (FastLane *)lane;
    int kind;
    switch (op->op) {
    case OP_ALL_REDUCE: kind = K_ALL_REDUCE; break;
    case OP_BROADCAST: kind = K_BROADCAST; break;
    case OP_ALL_TO_ALL: kind = K_ALL_TO_ALL; break;
    case OP_ALL_GATHER: kind = K_ALL_GATHER; break;
    case OP_REDUCE_SCATTER: kind = K_REDUCE_SCATTER; break;
    case OP_BARRIER: kind = K_BARRIER; break;
    default: return ND_LANE_NOT_TAKEN;
    }
    int redop = 0, di = 0;
    if (kind != K_BARRIER) {
        /* what FastLane's methods take: a dtype ``describe`` knows, a reduce op it may finish here,
         * at least one element; the rest (the Python hooks check and run it) is not taken */
        if (op->outbytes == 0 || op->dtype < 1 || op->dtype >= NCODES)
            return ND_LANE_NOT_TAKEN;
        CodeInfo *c = &f->codes[op->dtype];
        int ready = atomic_load_explicit(&c->ready, memory_order_acquire);
        if (!ready) { /* the code's first sight on this lane: with the GIL */
            PyGILState_STATE st = PyGILState_UNLOCKED;
            if (ts)
                st = PyGILState_Ensure();
            ready = learn(f, op->dtype, dtypes);
            if (ready < 0 && ts)
                PyErr_Fetch(&out->err[0], &out->err[1], &out->err[2]);
            if (ts)
                PyGILState_Release(st);
            if (ready < 0)
                return -1;
        }
        if (ready != CODE_TAKEN)
            return ND_LANE_NOT_TAKEN;
        if (kind == K_ALL_REDUCE || kind == K_REDUCE_SCATTER) {
            redop = op->redop;
            int mask = atomic_load_explicit(&c->mask, memory_order_relaxed);
            if (redop < 1 || redop >= NREDOPS || !(mask & (1 << redop)))
                return ND_LANE_NOT_TAKEN;
        }
        di = atomic_load_explicit(&c->ridx, memory_order_relaxed);
    }
    if (claim_lane(f, ts, 1) <= 0) /* (a C interface call's claim: never -1) */
        return ND_LANE_NOT_TAKEN;
    return core(f, kind, op, count_in, count_out, di, redop, ts, 1, out);
}

/* all_reduce(tensor, op) */
static PyObject *FastLane_all_reduce(FastLane *f, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "FastLane.all_reduce(tensor, op)");
        return NULL;
    }
    PyObject *opo = args[1];
    Arg a = {0};
    int k = read_arg(f, args[0], &a);
    if (k < 0)
        return NULL;
    if (!k || (a.flags & NP_CARRAY) != NP_CARRAY)
        return pass_on(f, &a, "all_reduce", args, nargs);
    int redop = 0;
    for (int r = 1; r < NREDOPS; r++)
        if (f->redops[r] == opo) {
            redop = r;
            break;
        }
    if (!redop)
        return pass_on(f, &a, "all_reduce", args, nargs);
    DInfo *d = dinfo(f, a.descr);
    if (!d) {
        release_arg(&a);
        return NULL;
    }
    Py_ssize_t count = a.count;
    if (!d->code || !(d->mask & (1 << redop)) || count == 0)
        return pass_on(f, &a, "all_reduce", args, nargs);
    int c = claim(f);
    if (c <= 0) {
        if (c < 0) {
            release_arg(&a);
            return NULL;
        }
        return pass_on(f, &a, "all_reduce", args, nargs);
    }
    Py_ssize_t nbytes = count * d->esize;
    NdOp op = {OP_ALL_REDUCE, d->code, redop, -1, nbytes > f->rsag_min, d->esize, NULL, a.data, nbytes, NULL, 0};
    PyObject *r = run(f, K_ALL_REDUCE, &op, count, count, a.descr, redop);
    release_arg(&a);
    return r;
}

/* broadcast(tensor, src, group_src) */
static PyObject *FastLane_broadcast(FastLane *f, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "FastLane.broadcast(tensor, src, group_src)");
        return NULL;
    }
    PyObject *src = args[1];
    Arg a = {0};
    int k = read_arg(f, args[0], &a);
    if (k < 0)
        return NULL;
    if (!k || (a.flags & NP_CARRAY) != NP_CARRAY || !PyLong_CheckExact(src) || args[2] != Py_None)
        return pass_on(f, &a, "broadcast", args, nargs);
    PyObject *root = PyDict_GetItemWithError(f->group_rank, src); /* borrowed */
    if (!root) {
        if (PyErr_Occurred()) {
            release_arg(&a);
            return NULL;
        }
        return pass_on(f, &a, "broadcast", args, nargs);
    }
    DInfo *d = dinfo(f, a.descr);
    if (!d) {
        release_arg(&a);
        return NULL;
    }
    Py_ssize_t count = a.count;
    if (!d->code || !d->plain || count == 0)
        return pass_on(f, &a, "broadcast", args, nargs);
    int c = claim(f);
    if (c <= 0) {
        if (c < 0) {
            release_arg(&a);
            return NULL;
        }
        return pass_on(f, &a, "broadcast", args, nargs);
    }
    Py_ssize_t nbytes = count * d->esize;
    NdOp op = {OP_BROADCAST, d->code, 0, (int)PyLong_AsLong(root), 0, d->esize, NULL, a.data, nbytes, NULL, 0};
    PyObject *r = run(f, K_BROADCAST, &op, count, count, a.descr, 0);
    release_arg(&a);
    return r;
}

/* an output and an input as the two-buffer ops take them (read into ``o`` and ``i``, zeroed by
 * the caller, released by it whatever the answer): ``out`` writable, C-contiguous and aligned,
 * ``in`` C-contiguous, one dtype (the same object), neither empty, the two byte ranges apart
 * (np.may_share_memory's bounds); 1, 0: not, -1: an error */
static int two(FastLane *f, PyObject *ot, PyObject *it, Arg *o, Arg *i, DInfo **dp)
{
    int k = read_arg(f, ot, o);
    if (k <= 0)
        return k;
    if ((o->flags & NP_CARRAY) != NP_CARRAY || (k = read_arg(f, it, i)) <= 0)
        return k < 0 ? -1 : 0;
    if (!(i->flags & NP_C_CONTIGUOUS) || o->descr != i->descr || o->count == 0 || i->count == 0)
        return 0;
    DInfo *d = dinfo(f, o->descr);
    if (!d)
        return -1;
    if (!d->code || !d->plain)
        return 0;
    if (o->data < i->data + i->count * d->esize && i->data < o->data + o->count * d->esize)
        return 0;
    *dp = d;
    return 1;
}

/* the end of a two-buffer op: both arguments let go, ``r`` returned */
static PyObject *two_done(Arg *o, Arg *i, PyObject *r)
{
    release_arg(i);
    release_arg(o);
    return r;
}

/* Split sizes as the Python lane takes them (``_plain._splits``): a list or tuple (exactly) of
 * ``n`` Python ints (exactly ``int``), none negative, that sum to ``rows``; into ``c`` as element
 * counts (each times ``row``, the elements of a row). 1: taken; 0: not (the Python lane, then the
 * general path, check them and raise their own errors). Nothing of the caller's list is kept. */
static int splits(PyObject *s, Py_ssize_t rows, Py_ssize_t row, int n, Py_ssize_t *c)
{
    if ((!PyList_CheckExact(s) && !PyTuple_CheckExact(s)) || PySequence_Fast_GET_SIZE(s) != n)
        return 0;
    PyObject **items = PySequence_Fast_ITEMS(s);
    Py_ssize_t total = 0;
    for (int q = 0; q < n; q++) {
        if (!PyLong_CheckExact(items[q]))
            return 0;
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(items[q], &overflow); /* (an exact int: no error) */
        if (overflow || v < 0 || v > rows - total)
            return 0;
        total += (Py_ssize_t)v;
        c[q] = (Py_ssize_t)v * row;
    }
    return total == rows;
}

#define NSPLITS 64 /* split sizes of groups up to this many ranks on the stack */

/* all_to_all_single(output, input, output_split_sizes, input_split_sizes): the even form (no
 * split sizes), and the uneven one (both given, as the Python lane takes them: ``splits``; the
 * trailing dimensions alike; what this rank sends itself is what it receives from itself) */
static PyObject *FastLane_all_to_all_single(FastLane *f, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "FastLane.all_to_all_single(output, input, output_split_sizes, "
                                         "input_split_sizes)");
        return NULL;
    }
    int even = args[2] == Py_None && args[3] == Py_None;
    if (args[0] == args[1] || (!even && (args[2] == Py_None || args[3] == Py_None)))
        return delegate(f, "all_to_all_single", args, nargs);
    Arg o = {0}, i = {0};
    DInfo *d;
    Py_ssize_t stack[2 * NSPLITS], *counts = NULL;
    int n = f->size;
    int t = two(f, args[0], args[1], &o, &i, &d);
    if (t < 0)
        return two_done(&o, &i, NULL);
    if (t == 0 || o.nd != i.nd || o.nd < 1)
        goto pass;
    for (int k = even ? 0 : 1; k < o.nd; k++)
        if (arg_dim(&o, k) != arg_dim(&i, k))
            goto pass;
    if (even && arg_dim(&o, 0) % n)
        goto pass;
    if (!even) { /* element counts: this rank's blocks of output, then of input */
        counts = n <= NSPLITS ? stack : PyMem_Malloc(2 * (size_t)n * sizeof(Py_ssize_t));
        if (!counts) {
            two_done(&o, &i, NULL);
            return PyErr_NoMemory();
        }
        Py_ssize_t orows = arg_dim(&o, 0), irows = arg_dim(&i, 0);
        Py_ssize_t row = orows ? o.count / orows : 0; /* (rows of 0: no element, two() passed it on) */
        if (!splits(args[2], orows, row, n, counts) || !splits(args[3], irows, row, n, counts + n) ||
            counts[f->rank] != counts[n + f->rank])
            goto pass;
    }
    int c = claim(f);
    if (c < 0)
        goto fail;
    if (c == 0)
        goto pass;
    NdOp op = {OP_ALL_TO_ALL, d->code, 0, -1, 0, d->esize, NULL, o.data, o.count * d->esize, i.data,
               i.count * d->esize, counts, counts ? counts + n : NULL};
    PyObject *r = run(f, K_ALL_TO_ALL, &op, i.count, o.count, o.descr, 0);
    if (counts != stack)
        PyMem_Free(counts);
    return two_done(&o, &i, r);
pass:
    if (counts != stack)
        PyMem_Free(counts);
    two_done(&o, &i, NULL);
    return delegate(f, "all_to_all_single", args, nargs);
fail:
    if (counts != stack)
        PyMem_Free(counts);
    return two_done(&o, &i, NULL);
}

/* all_gather_into(output, input): output holds size x input */
static PyObject *FastLane_all_gather_into(FastLane *f, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "FastLane.all_gather_into(output, input)");
        return NULL;
    }
    Arg o = {0}, i = {0};
    DInfo *d;
    int t = two(f, args[0], args[1], &o, &i, &d);
    if (t < 0)
        return two_done(&o, &i, NULL);
    if (t == 0 || o.count != i.count * f->size)
        goto pass;
    int c = claim(f);
    if (c < 0)
        return two_done(&o, &i, NULL);
    if (c == 0)
        goto pass;
    NdOp op = {OP_ALL_GATHER, d->code, 0, -1, 0, d->esize, NULL, o.data, o.count * d->esize, i.data,
               i.count * d->esize};
    return two_done(&o, &i, run(f, K_ALL_GATHER, &op, i.count, o.count, o.descr, 0));
pass:
    two_done(&o, &i, NULL);
    return delegate(f, "all_gather_into", args, nargs);
}

/* reduce_scatter_from(output, input, op): input holds size x output */
static PyObject *FastLane_reduce_scatter_from(FastLane *f, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "FastLane.reduce_scatter_from(output, input, op)");
        return NULL;
    }
    int redop = 0;
    for (int r = 1; r < NREDOPS; r++)
        if (f->redops[r] == args[2]) {
            redop = r;
            break;
        }
    if (!redop)
        return delegate(f, "reduce_scatter_from", args, nargs);
    Arg o = {0}, i = {0};
    DInfo *d;
    int t = two(f, args[0], args[1], &o, &i, &d);
    if (t < 0)
        return two_done(&o, &i, NULL);
    if (t == 0 || i.count != o.count * f->size || !(d->mask & (1 << redop)))
        goto pass;
    int c = claim(f);
    if (c < 0)
        return two_done(&o, &i, NULL);
    if (c == 0)
        goto pass;
    NdOp op = {OP_REDUCE_SCATTER, d->code, redop, -1, 0, d->esize, NULL, o.data, o.count * d->esize, i.data,
               i.count * d->esize};
    return two_done(&o, &i, run(f, K_REDUCE_SCATTER, &op, i.count, o.count, o.descr, redop));
pass:
    two_done(&o, &i, NULL);
    return delegate(f, "reduce_scatter_from", args, nargs);
}

/* barrier() */
static PyObject *FastLane_barrier(FastLane *f, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 0) {
        PyErr_SetString(PyExc_TypeError, "FastLane.barrier()");
        return NULL;
    }
    int c = claim(f);
    if (c <= 0)
        return c < 0 ? NULL : delegate(f, "barrier", args, nargs);
    NdOp op = {OP_BARRIER, 0, 0, -1, 0, 0, NULL, NULL, 0, NULL, 0};
    return run(f, K_BARRIER, &op, 0, 0, NULL, 0);
}

/* dlpack_dtypes(((code, bits, dtype), ...)): the NumPy dtype each DLPack (code, bits) is read as
 * (``native/_fast.py``: those ``np.from_dlpack`` gives); none: only NumPy arrays and ndist.Tensors */
static PyObject *FastLane_dlpack_dtypes(FastLane *f, PyObject *table)
{
    if (!PyTuple_Check(table) || PyTuple_GET_SIZE(table) > NDLTYPES) {
        PyErr_Format(PyExc_TypeError, "FastLane.dlpack_dtypes: expected a tuple of at most %d entries", NDLTYPES);
        return NULL;
    }
    for (int i = 0; i < f->ndl; i++)
        Py_CLEAR(f->dl[i].descr);
    f->ndl = 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(table); i++) {
        int code, bits;
        PyObject *descr;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(table, i), "iiO:dlpack_dtypes", &code, &bits, &descr))
            return NULL;
        f->dl[f->ndl].key = code << 8 | bits;
        f->dl[f->ndl++].descr = Py_NewRef(descr);
    }
    Py_RETURN_NONE;
}

/* buffer_dtypes(((format, dtype), ...)): the NumPy dtype a buffer of each struct format is read as
 * (``_convert.BUFFER_FORMATS``: one character, or 'Z' and one); none: no buffer is read here */
static PyObject *FastLane_buffer_dtypes(FastLane *f, PyObject *table)
{
    if (!PyTuple_Check(table) || PyTuple_GET_SIZE(table) > NBFTYPES) {
        PyErr_Format(PyExc_TypeError, "FastLane.buffer_dtypes: expected a tuple of at most %d entries", NBFTYPES);
        return NULL;
    }
    for (int i = 0; i < f->nbf; i++)
        Py_CLEAR(f->bf[i].descr);
    f->nbf = 0;
    memset(f->bf_index, 0, sizeof f->bf_index);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(table); i++) {
        const char *fmt;
        PyObject *descr;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(table, i), "sO:buffer_dtypes", &fmt, &descr))
            return NULL;
        const unsigned char *p = (const unsigned char *)fmt;
        int two = p[0] == 'Z';
        if (!p[0] || p[0] >= 0x80 || (two && (!p[1] || p[1] >= 0x80)) || p[two ? 2 : 1]) {
            PyErr_Format(PyExc_ValueError, "FastLane.buffer_dtypes: expected a format of one character or 'Z' and "
                                           "one, got %R", PyTuple_GET_ITEM(PyTuple_GET_ITEM(table, i), 0));
            return NULL;
        }
        PyObject *size = PyObject_GetAttrString(descr, "itemsize");
        if (!size)
            return NULL;
        Py_ssize_t itemsize = PyLong_AsSsize_t(size);
        Py_DECREF(size);
        if (itemsize < 0)
            return PyErr_Occurred() ? NULL : PyErr_Format(PyExc_ValueError, "FastLane.buffer_dtypes: bad itemsize");
        f->bf[f->nbf].descr = Py_NewRef(descr);
        f->bf[f->nbf].itemsize = itemsize;
        f->bf_index[two ? 0x80 | p[1] : p[0]] = (unsigned char)++f->nbf;
    }
    Py_RETURN_NONE;
}

static const char *const KIND_NAMES[] = {"all_reduce", "broadcast", "all_to_all", "all_gather", "reduce_scatter",
                                         "barrier"};

/* current() -> (name, dtype code, count, seq, root, reduce op): the last op this lane ran (or
 * runs), as NativeAlgorithms.op holds the Python paths' (``desc`` takes the newer by seq); None
 * before its first. Read as a seqlock: again when the lane's claimant wrote meanwhile. */
static PyObject *FastLane_current(FastLane *f, PyObject *unused)
{
    int op = 0, code = 0, root = 0, redop = 0;
    Py_ssize_t count = 0;
    unsigned long long seq = 0;
    for (unsigned k = 0;; nd_ring_pause(&k)) {
        unsigned g = atomic_load_explicit(&f->cur_gen, memory_order_acquire);
        if (g & 1)
            continue;
        op = ND_GET(f->cur_op), code = ND_GET(f->cur_code), count = ND_GET(f->cur_count);
        seq = ND_GET(f->cur_seq), root = ND_GET(f->cur_root), redop = ND_GET(f->cur_redop);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&f->cur_gen, memory_order_relaxed) == g)
            break;
    }
    if (!seq)
        Py_RETURN_NONE;
    PyObject *r = redop > 0 && redop < NREDOPS ? f->redops[redop] : Py_None;
    return Py_BuildValue("(sinKiO)", KIND_NAMES[op], code, count, seq, root, r);
}

static PyMethodDef FastLane_methods[] = {
    {"all_reduce", (PyCFunction)(void (*)(void))FastLane_all_reduce, METH_FASTCALL,
     "all_reduce(tensor, op) -> bool: ran (True) or the general path must (False)"},
    {"broadcast", (PyCFunction)(void (*)(void))FastLane_broadcast, METH_FASTCALL,
     "broadcast(tensor, src, group_src) -> bool"},
    {"all_to_all_single", (PyCFunction)(void (*)(void))FastLane_all_to_all_single, METH_FASTCALL,
     "all_to_all_single(output, input, output_split_sizes, input_split_sizes) -> bool"},
    {"all_gather_into", (PyCFunction)(void (*)(void))FastLane_all_gather_into, METH_FASTCALL,
     "all_gather_into(output, input) -> bool"},
    {"reduce_scatter_from", (PyCFunction)(void (*)(void))FastLane_reduce_scatter_from, METH_FASTCALL,
     "reduce_scatter_from(output, input, op) -> bool"},
    {"barrier", (PyCFunction)(void (*)(void))FastLane_barrier, METH_FASTCALL, "barrier() -> bool"},
    {"current", (PyCFunction)FastLane_current, METH_NOARGS,
     "current() -> the description tuple of the op this lane ran last, or None"},
    {"dlpack_dtypes", (PyCFunction)FastLane_dlpack_dtypes, METH_O,
     "dlpack_dtypes(((code, bits, dtype), ...)): the NumPy dtype of each DLPack dtype read"},
    {"buffer_dtypes", (PyCFunction)FastLane_buffer_dtypes, METH_O,
     "buffer_dtypes(((format, dtype), ...)): the NumPy dtype of each buffer format read"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject FastLaneType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_cnative.FastLane",
    .tp_basicsize = sizeof(FastLane),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)FastLane_init,
    .tp_dealloc = (destructor)FastLane_dealloc,
    .tp_traverse = (traverseproc)FastLane_traverse,
    .tp_clear = (inquiry)FastLane_clear,
    .tp_methods = FastLane_methods,
    .tp_doc = "A group's repeated blocking collectives in one C call (see the module source).",
};

int nd_lane_is(PyObject *o) { return Py_TYPE(o) == &FastLaneType; }

int nd_lane_add(PyObject *m)
{
    if (!(s_data = PyUnicode_InternFromString("_data")) || !(s_is_neg = PyUnicode_InternFromString("is_neg")) ||
        !(s_is_conj = PyUnicode_InternFromString("is_conj")) ||
        !(s_dlpack = PyUnicode_InternFromString("__dlpack__")) ||
        !(s_dlpack_device = PyUnicode_InternFromString("__dlpack_device__")) ||
        !(s_module = PyUnicode_InternFromString("__module__")) || !(s_Tensor = PyUnicode_InternFromString("Tensor")) ||
        !(s_nn = PyUnicode_InternFromString("nn")) || !(s_Parameter = PyUnicode_InternFromString("Parameter")) ||
        !(s_exchange = PyUnicode_InternFromString("__dlpack_c_exchange_api__")) ||
        !(s_ndist_tensor = PyUnicode_InternFromString("ndist.tensor")) ||
        !(s_torch = PyUnicode_InternFromString("torch")) || !(s_cupy = PyUnicode_InternFromString("cupy")) ||
        !(dl_kwnames = Py_BuildValue("(sss)", "dl_device", "copy", "max_version")) ||
        !(dl_args_tail = Py_BuildValue("(OO(ii))", Py_None, Py_None, 1, 0)))
        return -1;
    if (!(s_array_interface = PyUnicode_InternFromString("__array_interface__")) ||
        !(s_array_struct = PyUnicode_InternFromString("__array_struct__")) ||
        !(s_cuda_array_interface = PyUnicode_InternFromString("__cuda_array_interface__")))
        return -1;
    if (PyType_Ready(&LaneStateType) < 0 || PyType_Ready(&FastLaneType) < 0)
        return -1;
    Py_INCREF(&LaneStateType);
    if (PyModule_AddObject(m, "LaneState", (PyObject *)&LaneStateType) < 0) {
        Py_DECREF(&LaneStateType);
        return -1;
    }
    Py_INCREF(&FastLaneType);
    if (PyModule_AddObject(m, "FastLane", (PyObject *)&FastLaneType) < 0) {
        Py_DECREF(&FastLaneType);
        return -1;
    }
    return 0;
}
