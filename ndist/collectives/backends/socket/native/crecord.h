/* The flight recorder's ring and the lanes' sequence counters in C (crecord.c; docs/reliability.md,
 * "Flight recorder"): what a group's ``FlightRecorder`` (collectives/_debug.py) holds once the socket
 * backend handed it these (``FlightRecorder.adopt``), so that the repeated call in C (clane.c's
 * ``core``: FastLane and the C interface) numbers and records an operation without making a Python
 * object.
 *
 * ``Counter``: an iterator of 1, 2, 3, ... (as ``itertools.count(1)``): Python paths call ``next()``
 * on it, C adds one to ``last`` (``nd_counter_next``); with the GIL either way, so the numbers of a
 * (group, device) are one sequence whoever takes them.
 *
 * ``Ring``: the last ``maxlen`` entries, oldest first. An entry is either a Python caller's list (the
 * 10-list of ``_debug.FIELDS``, appended by ``append`` as to a ``deque(maxlen=...)``, updated in place
 * by its owner) or a C slot: the same fields as numbers (``nd_ring_issue``, ended in place by
 * ``nd_ring_done``), made into that 10-list when read (``copy``) or when its operation failed
 * (``nd_ring_entry``: the list then takes the slot's place, so the failure hook's updates show). The
 * op, device and dtype of a C slot are indices into the ring's table of objects (``nd_ring_index``;
 * 0 is None), interned with the GIL.
 *
 * An entry is numbered ``n`` (1, 2, ...: how many were appended up to it) and lives in slot
 * ``(n - 1) % maxlen`` until the entry ``n + maxlen`` replaces it; a slot that no longer holds ``n``
 * is gone, as a list pushed out of a deque. Everything here runs with the GIL held. */
#ifndef NDIST_NATIVE_CRECORD_H
#define NDIST_NATIVE_CRECORD_H

#include <Python.h>
#include <stdint.h>
#include <time.h>

/* the entry's fields by position (_debug.FIELDS) */
enum { RF_SEQ, RF_OP, RF_DEVICE, RF_DTYPE, RF_COUNT_IN, RF_COUNT_OUT, RF_ROOT, RF_T_ISSUED, RF_T_DONE, RF_ERROR,
       RF_N };

typedef struct {
    PyObject_HEAD
    unsigned long long last; /* the last number handed out */
} NdCounter;

typedef struct {
    uint64_t n;     /* the entry held (0: none yet) */
    PyObject *list; /* a Python entry (owned), or NULL: the fields below */
    unsigned long long seq;
    Py_ssize_t count_in, count_out;
    double t_issued, t_done;
    int op, device, dtype; /* indices into the ring's objects */
    int root;              /* < 0: None */
    int done;              /* t_done is set */
} NdSlot;

typedef struct {
    PyObject_HEAD
    NdSlot *slots;
    Py_ssize_t maxlen;
    uint64_t count;  /* entries appended so far */
    PyObject **objs; /* the objects C slots name: objs[0] is None */
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

/* the next number of counter ``c`` */
static inline unsigned long long nd_counter_next(NdCounter *c) { return ++c->last; }

/* the index of ``o`` in the ring's objects, added on a first sight; -1 with an error set */
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

/* a C entry issued now (the oldest drops out of a full ring); its number */
static inline uint64_t nd_ring_issue(NdRing *r, unsigned long long seq, int op, int device, int dtype,
                                     Py_ssize_t count_in, Py_ssize_t count_out, int root)
{
    uint64_t n = ++r->count;
    NdSlot *s = nd_ring_slot(r, n);
    PyObject *old = s->list;
    *s = (NdSlot){n, NULL, seq, count_in, count_out, nd_now(), 0.0, op, device, dtype, root, 0};
    Py_XDECREF(old); /* (after the slot is whole: a list's deallocation runs no Python code, but could) */
    return n;
}

/* entry ``n`` ended now, when it is still in the ring and a C slot */
static inline void nd_ring_done(NdRing *r, uint64_t n)
{
    NdSlot *s = nd_ring_slot(r, n);
    if (s->n == n && !s->list) {
        s->t_done = nd_now();
        s->done = 1;
    }
}

/* entry ``n`` as its 10-list, which from now on is the ring's entry (a new reference); NULL without an
 * error when the entry is gone, NULL with one on failure */
PyObject *nd_ring_entry(NdRing *r, uint64_t n);

/* crecord.c: add ``Counter`` and ``Ring`` to module ``m``; 0 or -1 with a Python error set */
int nd_record_add(PyObject *m);

#endif
