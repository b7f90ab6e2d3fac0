/* The flight recorder's ring and the lanes' sequence counters in C (crecord.c; docs/reliability.md,
 * "Flight recorder"): what a group's ``FlightRecorder`` (collectives/_debug.py) holds once the socket
 * backend handed it these (``FlightRecorder.adopt``), so that the repeated call in C (clane.c's
 * ``core``: FastLane and the C interface) numbers and records an operation without making a Python
 * object, and without the GIL.
 *
 * ``Counter``: an iterator of 1, 2, 3, ... (as ``itertools.count(1)``): Python paths call ``next()``
 * on it, C adds one to ``last`` (``nd_counter_next``); one atomic add either way (C11), so the
 * numbers of a (group, device) are one sequence whoever takes them, with the GIL or without.
 *
 * ``Ring``: the last ``maxlen`` entries, oldest first. An entry is either a Python caller's list (the
 * 10-list of ``_debug.FIELDS``, appended by ``append`` as to a ``deque(maxlen=...)``, updated in place
 * by its owner) or a C slot: the same fields as numbers (``nd_ring_issue``, ended in place by
 * ``nd_ring_done``), made into that 10-list when read (``copy``) or when its operation failed
 * (``nd_ring_entry``: the list then takes the slot's place, so the failure hook's updates show). The
 * op, device and dtype of a C slot are indices into the ring's table of objects (``nd_ring_index``;
 * 0 is None), interned with the GIL (a caller without it passes indices it interned before).
 *
 * An entry is numbered ``n`` (1, 2, ...: how many were appended up to it, ``count``, one atomic add)
 * and lives in slot ``(n - 1) % maxlen`` until the entry ``n + maxlen`` replaces it; a slot that no
 * longer holds ``n`` is gone, as a list pushed out of a deque.
 *
 * Who runs what: ``nd_ring_issue`` and ``nd_ring_done`` need no GIL (the C core calls them with or
 * without it); everything else (``append``, ``copy``, ``nd_ring_entry``, the interning, the
 * garbage collector's visits) runs with the GIL. A slot's ``gen`` orders them (C11 atomics): 2n
 * when entry n is whole (0: none yet), 2n + 1 while a writer or an update holds it. A writer of
 * entry n waits for the slot's previous entry (n - maxlen, or none) to be whole and takes the slot
 * by compare-and-swap (so two writers maxlen apart, and an update of the old entry, never mix);
 * an update of entry n (its end time, its list) takes 2n -> 2n + 1 the same way; a reader copies
 * the fields between two loads of ``gen`` and tries again when they differ (a seqlock). A slot's
 * ``list`` (an owned reference) is written only with the GIL: a C writer leaves the Python entry
 * it replaces there, flagged as a C slot (``c``), and the next writer with the GIL drops it.
 *
 * Why this is race-free by the C11 memory model (no data race, so no undefined behaviour, even
 * when a reader's copy is torn and thrown away), as Boehm's "Can seqlocks get along with
 * programming language memory models?" (MSPC 2012) builds a seqlock from fences:
 *   - every field a reader copies while a writer may write it (``c`` and the entry's numbers) is
 *     an ``_Atomic`` read and written with relaxed loads and stores (on x86-64 and AArch64 the
 *     same plain moves as before: no lock, no barrier), so a torn copy is a set of values, each
 *     one some store's, never a racing access;
 *   - a holder (``nd_ring_hold``) issues a release fence after its compare-and-swap and before
 *     its first field store; a reader loads ``gen`` (acquire), copies the fields (relaxed), then
 *     an acquire fence, then loads ``gen`` again (relaxed). If a copied value came from a store
 *     of a later holding, that holder's release fence synchronizes with the reader's acquire
 *     fence, so its odd ``gen`` happens before the second load, which then cannot read the
 *     first load's value (``gen`` only grows while a slot changes hands): the copy is retried.
 *     If every value came from stores before the first load's release (``nd_ring_release``), the
 *     copy is that whole entry;
 *   - ``gen`` goes back to 2n after an update of entry n (2n -> 2n + 1 -> 2n), so a reader whose
 *     two loads straddle an update is not told: an update therefore changes one field a C
 *     writer's reader can see, ``t_done`` (0.0 until the entry ended: ``time.time()`` is never
 *     0.0 here), and a copy has it from before or after, both true of the entry. (The other
 *     update, ``nd_ring_entry``'s swap of ``c`` and ``list``, runs with the GIL, as every reader
 *     does: no reader overlaps it.)
 *   - ``list`` is read and written with the GIL only; the GIL (a mutex) orders those accesses.
 * ThreadSanitizer checks it (docs/native.md, "Thread safety"). */
#ifndef NDIST_NATIVE_CRECORD_H
#define NDIST_NATIVE_CRECORD_H

#include <Python.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "common.h" /* (ND_GET, ND_SET: a relaxed atomic access) */

/* the entry's fields by position (_debug.FIELDS) */
enum { RF_SEQ, RF_OP, RF_DEVICE, RF_DTYPE, RF_COUNT_IN, RF_COUNT_OUT, RF_ROOT, RF_T_ISSUED, RF_T_DONE, RF_ERROR,
       RF_N };

typedef struct {
    PyObject_HEAD
    _Atomic unsigned long long last; /* the last number handed out */
} NdCounter;

typedef struct {
    _Atomic uint64_t gen; /* 2n: entry n whole (0: none yet); 2n + 1: held by its writer or an update */
    PyObject *list;       /* a Python entry (owned), or NULL; with ``c`` set: one replaced, to drop */
    /* (relaxed atomics: a reader may copy them while a writer writes, see above) */
    _Atomic int c;        /* the fields below are the entry (a C slot) */
    _Atomic unsigned long long seq;
    _Atomic Py_ssize_t count_in, count_out;
    _Atomic double t_issued, t_done; /* t_done 0.0: not ended yet */
    _Atomic int op, device, dtype;   /* indices into the ring's objects */
    _Atomic int root;                /* < 0: None */
} NdSlot;

/* a slot as a reader copied it (``snapshot``): plain values */
typedef struct {
    PyObject *list;
    int c;
    unsigned long long seq;
    Py_ssize_t count_in, count_out;
    double t_issued, t_done;
    int op, device, dtype, root;
} NdEntry;

typedef struct {
    PyObject_HEAD
    NdSlot *slots;
    Py_ssize_t maxlen;
    _Atomic uint64_t count; /* entries appended so far */
    PyObject **objs;        /* the objects C slots name: objs[0] is None (with the GIL only) */
    int nobjs, capobjs;
} NdRing;

extern PyTypeObject NdCounterType, NdRingType;

/* time.time() as a double: CLOCK_REALTIME, as Python computes it */
static inline double nd_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)((long long)ts.tv_sec * 1000000000LL + ts.tv_nsec) / 1e9;
}

/* the next number of counter ``c`` (with the GIL or without) */
static inline unsigned long long nd_counter_next(NdCounter *c) { return atomic_fetch_add(&c->last, 1) + 1; }

/* the index of ``o`` in the ring's objects, added on a first sight; -1 with an error set (with the GIL) */
int nd_ring_intern(NdRing *r, PyObject *o);
static inline int nd_ring_index(NdRing *r, PyObject *o)
{
    for (int i = r->nobjs - 1; i >= 0; i--) /* (newest first: the dtypes, after the ops) */
        if (r->objs[i] == o)
            return i;
    return nd_ring_intern(r, o);
}

/* the slot entry ``n`` lives in */
static inline NdSlot *nd_ring_slot(NdRing *r, uint64_t n) { return &r->slots[(n - 1) % (uint64_t)r->maxlen]; }

/* a short wait on another thread's few stores: spin, then give the core away */
static inline void nd_ring_pause(unsigned *k)
{
    if (++*k > 64)
        sched_yield();
}

/* take slot ``s`` from ``from`` (even: an entry whole) to ``to`` (odd: held); 0 when the slot holds
 * an entry past ``from``'s (it is gone) */
static inline int nd_ring_hold(NdSlot *s, uint64_t from, uint64_t to)
{
    unsigned k = 0;
    for (;;) {
        uint64_t g = atomic_load_explicit(&s->gen, memory_order_acquire);
        if (g == from && atomic_compare_exchange_weak_explicit(&s->gen, &g, to, memory_order_acquire,
                                                               memory_order_relaxed)) {
            /* (the odd gen before any field store, for a reader's acquire fence: see above; on
             * x86-64 a compiler barrier only) */
            atomic_thread_fence(memory_order_release);
            return 1;
        }
        if (g > from + 1) /* (a writer never meets this: the entry after its own waits for it) */
            return 0;
        nd_ring_pause(&k); /* (the previous entry or an update still writing: a few stores) */
    }
}

/* the next entry's number, its slot taken (the previous entry whole); ended by nd_ring_release */
static inline uint64_t nd_ring_take(NdRing *r, NdSlot **sp)
{
    uint64_t n = atomic_fetch_add(&r->count, 1) + 1, m = (uint64_t)r->maxlen;
    NdSlot *s = *sp = nd_ring_slot(r, n);
    nd_ring_hold(s, n > m ? 2 * (n - m) : 0, 2 * n + 1);
    return n;
}

/* slot ``s`` holds entry ``n``, whole */
static inline void nd_ring_release(NdSlot *s, uint64_t n)
{
    atomic_store_explicit(&s->gen, 2 * n, memory_order_release);
}

/* a C entry issued now (the oldest drops out of a full ring), with the GIL or without; its number */
static inline uint64_t nd_ring_issue(NdRing *r, unsigned long long seq, int op, int device, int dtype,
                                     Py_ssize_t count_in, Py_ssize_t count_out, int root)
{
    NdSlot *s;
    uint64_t n = nd_ring_take(r, &s);
    /* (a Python entry replaced stays in ``list`` until a writer with the GIL drops it) */
    ND_SET(s->c, 1), ND_SET(s->seq, seq), ND_SET(s->count_in, count_in), ND_SET(s->count_out, count_out);
    ND_SET(s->t_issued, nd_now()), ND_SET(s->t_done, 0.0), ND_SET(s->op, op), ND_SET(s->device, device);
    ND_SET(s->dtype, dtype), ND_SET(s->root, root);
    nd_ring_release(s, n);
    return n;
}

/* entry ``n`` ended now, when it is still in the ring and a C slot (with the GIL or without) */
static inline void nd_ring_done(NdRing *r, uint64_t n)
{
    NdSlot *s = nd_ring_slot(r, n);
    if (!nd_ring_hold(s, 2 * n, 2 * n + 1))
        return;
    if (ND_GET(s->c))
        ND_SET(s->t_done, nd_now()); /* (the one field an update changes: see above) */
    nd_ring_release(s, n);
}

/* entry ``n`` as its 10-list, which from now on is the ring's entry (a new reference); NULL without an
 * error when the entry is gone, NULL with one on failure (with the GIL) */
PyObject *nd_ring_entry(NdRing *r, uint64_t n);

/* crecord.c: add ``Counter`` and ``Ring`` to module ``m``; 0 or -1 with a Python error set */
int nd_record_add(PyObject *m);

#endif
