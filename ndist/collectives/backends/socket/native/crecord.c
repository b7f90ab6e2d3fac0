/* The flight recorder's ring and the lanes' sequence counters in C: ``Counter`` and ``Ring`` (the
 * layout and the calls C makes are in crecord.h, which says what each holds). Python sees them as an
 * ``itertools.count(1)`` and a ``deque(maxlen=...)`` of entries: ``next(counter)``,
 * ``ring.append(entry)``, ``ring.copy()`` (a list of the entries, oldest first: a C slot made into its
 * 10-list), ``iter(ring)`` (over such a copy), ``len(ring)``, ``ring.maxlen``. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <string.h>

#include "crecord.h"

/* ------------------------------------------------------------------ Counter */
static PyObject *Counter_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *names[] = {"start", NULL};
    long long start = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|L:Counter", names, &start))
        return NULL;
    if (start < 1) {
        PyErr_Format(PyExc_ValueError, "Counter: start: expected an int >= 1, got %lld", start);
        return NULL;
    }
    NdCounter *c = (NdCounter *)type->tp_alloc(type, 0);
    if (c)
        atomic_init(&c->last, (unsigned long long)start - 1);
    return (PyObject *)c;
}

static PyObject *Counter_next(NdCounter *c) { return PyLong_FromUnsignedLongLong(nd_counter_next(c)); }

static PyObject *Counter_repr(NdCounter *c)
{
    return PyUnicode_FromFormat("Counter(start=%llu)", atomic_load(&c->last) + 1);
}

static PyObject *Counter_last(NdCounter *c, void *unused)
{
    return PyLong_FromUnsignedLongLong(atomic_load(&c->last));
}

static PyGetSetDef Counter_getset[] = {
    {"last", (getter)Counter_last, NULL, "the last number handed out (0: none yet)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject NdCounterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_cnative.Counter",
    .tp_basicsize = sizeof(NdCounter),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = Counter_new,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)Counter_next,
    .tp_repr = (reprfunc)Counter_repr,
    .tp_getset = Counter_getset,
    .tp_doc = "Counter(start=1): the numbers start, start + 1, ... (as itertools.count), taken by Python "
              "(next) and by C alike.",
};

/* ------------------------------------------------------------------ Ring */
static PyObject *Ring_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *names[] = {"maxlen", NULL};
    Py_ssize_t maxlen;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "n:Ring", names, &maxlen))
        return NULL;
    if (maxlen < 1 || (size_t)maxlen > PY_SSIZE_T_MAX / sizeof(NdSlot)) {
        PyErr_Format(PyExc_ValueError, "Ring: maxlen: expected an int in [1, %zd], got %zd",
                     (Py_ssize_t)(PY_SSIZE_T_MAX / sizeof(NdSlot)), maxlen);
        return NULL;
    }
    NdRing *r = (NdRing *)type->tp_alloc(type, 0);
    if (!r)
        return NULL;
    r->slots = PyMem_Calloc((size_t)maxlen, sizeof(NdSlot)); /* (zero bytes: every atomic 0) */
    r->objs = PyMem_Malloc(8 * sizeof(PyObject *));
    if (!r->slots || !r->objs) {
        Py_DECREF(r);
        return PyErr_NoMemory();
    }
    r->maxlen = maxlen;
    r->capobjs = 8;
    r->objs[0] = Py_NewRef(Py_None);
    r->nobjs = 1;
    return (PyObject *)r;
}

/* (``list`` is written with the GIL only, which the collector holds: C writers leave it alone) */
static int Ring_traverse(NdRing *r, visitproc visit, void *arg)
{
    if (r->slots)
        for (Py_ssize_t i = 0; i < r->maxlen; i++)
            Py_VISIT(r->slots[i].list);
    for (int i = 0; i < r->nobjs; i++)
        Py_VISIT(r->objs[i]);
    return 0;
}

/* (only when the ring is garbage: no C writer holds it then) */
static int Ring_clear(NdRing *r)
{
    if (r->slots)
        for (Py_ssize_t i = 0; i < r->maxlen; i++)
            Py_CLEAR(r->slots[i].list);
    /* (the objects stay: a C slot may still name them; they hold no reference back) */
    return 0;
}

static void Ring_dealloc(NdRing *r)
{
    PyObject_GC_UnTrack(r);
    Ring_clear(r);
    for (int i = 0; i < r->nobjs; i++)
        Py_CLEAR(r->objs[i]);
    PyMem_Free(r->objs);
    PyMem_Free(r->slots);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

int nd_ring_intern(NdRing *r, PyObject *o)
{
    for (int i = 0; i < r->nobjs; i++)
        if (r->objs[i] == o)
            return i;
    if (r->nobjs == r->capobjs) {
        PyObject **grown = PyMem_Realloc(r->objs, 2 * (size_t)r->capobjs * sizeof(PyObject *));
        if (!grown) {
            PyErr_NoMemory();
            return -1;
        }
        r->objs = grown;
        r->capobjs *= 2;
    }
    r->objs[r->nobjs] = Py_NewRef(o);
    return r->nobjs++;
}

/* a C slot's 10-list (a new list), or NULL with an error set */
static PyObject *as_list(NdRing *r, const NdEntry *s)
{
    PyObject *items[RF_N] = {
        PyLong_FromUnsignedLongLong(s->seq), Py_NewRef(r->objs[s->op]), Py_NewRef(r->objs[s->device]),
        Py_NewRef(r->objs[s->dtype]), PyLong_FromSsize_t(s->count_in), PyLong_FromSsize_t(s->count_out),
        s->root < 0 ? Py_NewRef(Py_None) : PyLong_FromLong(s->root), PyFloat_FromDouble(s->t_issued),
        s->t_done != 0.0 ? PyFloat_FromDouble(s->t_done) : Py_NewRef(Py_None), Py_NewRef(Py_None)};
    PyObject *list = NULL;
    int ok = 1;
    for (int i = 0; i < RF_N; i++)
        ok = ok && items[i];
    if (ok)
        list = PyList_New(RF_N);
    for (int i = 0; i < RF_N; i++) {
        if (list)
            PyList_SET_ITEM(list, i, items[i]);
        else
            Py_XDECREF(items[i]);
    }
    return list;
}

/* entry ``n``'s slot read into ``out`` (its ``list`` a new reference): 1; 0 when the entry is gone.
 * A seqlock's read (crecord.h says why it is race-free): the fields copied, each a relaxed load,
 * between two loads of ``gen`` and an acquire fence, again if a writer came between; a writer of
 * ``n`` still at it (it took the number, not yet the slot) is waited for. */
static int snapshot(NdRing *r, uint64_t n, NdEntry *out)
{
    NdSlot *s = nd_ring_slot(r, n);
    unsigned k = 0;
    for (;;) {
        uint64_t g = atomic_load_explicit(&s->gen, memory_order_acquire);
        if (g > 2 * n + 1)
            return 0;
        if (g == 2 * n) {
            out->list = s->list; /* (with the GIL, as every write of it) */
            out->c = ND_GET(s->c), out->seq = ND_GET(s->seq), out->count_in = ND_GET(s->count_in);
            out->count_out = ND_GET(s->count_out), out->t_issued = ND_GET(s->t_issued);
            out->t_done = ND_GET(s->t_done), out->op = ND_GET(s->op), out->device = ND_GET(s->device);
            out->dtype = ND_GET(s->dtype), out->root = ND_GET(s->root);
            atomic_thread_fence(memory_order_acquire);
            if (atomic_load_explicit(&s->gen, memory_order_relaxed) == g) {
                /* (``list`` is changed with the GIL only, which the caller holds: it is alive) */
                Py_XINCREF(out->list);
                return 1;
            }
        }
        nd_ring_pause(&k);
    }
}

PyObject *nd_ring_entry(NdRing *r, uint64_t n)
{
    NdEntry snap;
    if (!snapshot(r, n, &snap))
        return NULL;
    if (!snap.c)
        return snap.list;
    Py_XDECREF(snap.list);
    PyObject *list = as_list(r, &snap);
    if (!list)
        return NULL;
    /* (as_list may have run the garbage collector, whose finalizers may have appended: still ours?
     * The slot is held only for the swap, no Python code runs meanwhile) */
    NdSlot *s = nd_ring_slot(r, n);
    if (!nd_ring_hold(s, 2 * n, 2 * n + 1)) {
        Py_DECREF(list);
        return NULL;
    }
    PyObject *old = NULL;
    if (ND_GET(s->c)) {
        old = s->list; /* (a Python entry a C writer replaced) */
        s->list = Py_NewRef(list);
        ND_SET(s->c, 0);
    } else
        Py_SETREF(list, Py_NewRef(s->list));
    nd_ring_release(s, n);
    Py_XDECREF(old);
    return list;
}

/* append(entry): a Python caller's entry (the oldest drops out of a full ring) */
static PyObject *Ring_append(NdRing *r, PyObject *entry)
{
    NdSlot *s;
    uint64_t n = nd_ring_take(r, &s);
    PyObject *old = s->list;
    s->list = Py_NewRef(entry);
    ND_SET(s->c, 0);
    nd_ring_release(s, n);
    Py_XDECREF(old);
    Py_RETURN_NONE;
}

/* copy() -> the entries, oldest first: Python entries themselves, C slots as new 10-lists. The
 * slots are read first (again from the newest count if one was replaced meanwhile by a C writer),
 * then made into lists (making them may run the garbage collector, whose finalizers may append
 * meanwhile). */
static PyObject *Ring_copy(NdRing *r, PyObject *unused)
{
    NdEntry *snap = NULL;
    uint64_t count, len, got, cap = 0;
    do {
        count = atomic_load(&r->count);
        len = count < (uint64_t)r->maxlen ? count : (uint64_t)r->maxlen;
        if (len > cap || !snap) { /* (the first time, or more entries than the last try saw) */
            NdEntry *grown = PyMem_Realloc(snap, (len ? len : 1) * sizeof(NdEntry));
            if (!grown) {
                PyMem_Free(snap);
                return PyErr_NoMemory();
            }
            snap = grown, cap = len;
        }
        for (got = 0; got < len && snapshot(r, count - len + 1 + got, &snap[got]); got++)
            ;
        if (got < len) /* (an entry was replaced meanwhile: the ring moved on) */
            for (uint64_t i = 0; i < got; i++)
                Py_XDECREF(snap[i].list);
    } while (got < len);
    PyObject *out = PyList_New((Py_ssize_t)len);
    for (uint64_t i = 0; i < len; i++) {
        PyObject *e = NULL;
        if (out && snap[i].c)
            e = as_list(r, &snap[i]);
        else if (out) {
            e = snap[i].list;
            snap[i].list = NULL; /* (the reference moves to ``out``) */
        }
        if (out && e)
            PyList_SET_ITEM(out, (Py_ssize_t)i, e);
        else {
            Py_XDECREF(e);
            Py_CLEAR(out);
        }
    }
    for (uint64_t i = 0; i < len; i++)
        Py_XDECREF(snap[i].list);
    PyMem_Free(snap);
    return out;
}

/* iter(ring): over a copy (a deque's iterator would fail on an append meanwhile; this one sees none) */
static PyObject *Ring_iter(NdRing *r)
{
    PyObject *copy = Ring_copy(r, NULL);
    if (!copy)
        return NULL;
    PyObject *it = PyObject_GetIter(copy);
    Py_DECREF(copy);
    return it;
}

static Py_ssize_t Ring_len(NdRing *r)
{
    uint64_t count = atomic_load(&r->count);
    return count < (uint64_t)r->maxlen ? (Py_ssize_t)count : r->maxlen;
}

static PyObject *Ring_count(NdRing *r, void *unused) { return PyLong_FromUnsignedLongLong(atomic_load(&r->count)); }

static PyMethodDef Ring_methods[] = {
    {"append", (PyCFunction)Ring_append, METH_O, "append(entry): the oldest drops out of a full ring"},
    {"copy", (PyCFunction)Ring_copy, METH_NOARGS, "copy() -> the entries as lists, oldest first"},
    {NULL, NULL, 0, NULL},
};
static PyMemberDef Ring_members[] = {
    {"maxlen", T_PYSSIZET, offsetof(NdRing, maxlen), READONLY, "how many entries it keeps"},
    {NULL, 0, 0, 0, NULL},
};
static PyGetSetDef Ring_getset[] = {
    {"count", (getter)Ring_count, NULL, "entries appended so far", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};
static PySequenceMethods Ring_as_sequence = {.sq_length = (lenfunc)Ring_len};

PyTypeObject NdRingType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_cnative.Ring",
    .tp_basicsize = sizeof(NdRing),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = Ring_new,
    .tp_dealloc = (destructor)Ring_dealloc,
    .tp_traverse = (traverseproc)Ring_traverse,
    .tp_clear = (inquiry)Ring_clear,
    .tp_iter = (getiterfunc)Ring_iter,
    .tp_methods = Ring_methods,
    .tp_members = Ring_members,
    .tp_getset = Ring_getset,
    .tp_as_sequence = &Ring_as_sequence,
    .tp_doc = "Ring(maxlen): a flight recorder's last maxlen entries, appended by Python (append) and by C "
              "(crecord.h); copy() lists them, oldest first.",
};

int nd_record_add(PyObject *m)
{
    if (PyType_Ready(&NdCounterType) < 0 || PyType_Ready(&NdRingType) < 0)
        return -1;
    Py_INCREF(&NdCounterType);
    if (PyModule_AddObject(m, "Counter", (PyObject *)&NdCounterType) < 0) {
        Py_DECREF(&NdCounterType);
        return -1;
    }
    Py_INCREF(&NdRingType);
    if (PyModule_AddObject(m, "Ring", (PyObject *)&NdRingType) < 0) {
        Py_DECREF(&NdRingType);
        return -1;
    }
    return 0;
}
