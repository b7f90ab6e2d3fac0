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
        c->last = (unsigned long long)start - 1;
    return (PyObject *)c;
}

static PyObject *Counter_next(NdCounter *c) { return PyLong_FromUnsignedLongLong(nd_counter_next(c)); }

static PyObject *Counter_repr(NdCounter *c) { return PyUnicode_FromFormat("Counter(start=%llu)", c->last + 1); }

static PyMemberDef Counter_members[] = {
    {"last", T_ULONGLONG, offsetof(NdCounter, last), READONLY, "the last number handed out (0: none yet)"},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject NdCounterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_cnative.Counter",
    .tp_basicsize = sizeof(NdCounter),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = Counter_new,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)Counter_next,
    .tp_repr = (reprfunc)Counter_repr,
    .tp_members = Counter_members,
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
    r->slots = PyMem_Calloc((size_t)maxlen, sizeof(NdSlot));
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

static int Ring_traverse(NdRing *r, visitproc visit, void *arg)
{
    if (r->slots)
        for (Py_ssize_t i = 0; i < r->maxlen; i++)
            Py_VISIT(r->slots[i].list);
    for (int i = 0; i < r->nobjs; i++)
        Py_VISIT(r->objs[i]);
    return 0;
}

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
static PyObject *as_list(NdRing *r, const NdSlot *s)
{
    PyObject *items[RF_N] = {
        PyLong_FromUnsignedLongLong(s->seq), Py_NewRef(r->objs[s->op]), Py_NewRef(r->objs[s->device]),
        Py_NewRef(r->objs[s->dtype]), PyLong_FromSsize_t(s->count_in), PyLong_FromSsize_t(s->count_out),
        s->root < 0 ? Py_NewRef(Py_None) : PyLong_FromLong(s->root), PyFloat_FromDouble(s->t_issued),
        s->done ? PyFloat_FromDouble(s->t_done) : Py_NewRef(Py_None), Py_NewRef(Py_None)};
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

PyObject *nd_ring_entry(NdRing *r, uint64_t n)
{
    NdSlot *s = nd_ring_slot(r, n);
    if (s->n != n)
        return NULL;
    if (s->list)
        return Py_NewRef(s->list);
    PyObject *list = as_list(r, s);
    if (!list)
        return NULL;
    /* (as_list may have run the garbage collector, whose finalizers may have appended: still ours?) */
    if (s->n != n) {
        Py_DECREF(list);
        return NULL;
    }
    if (!s->list)
        s->list = Py_NewRef(list);
    else
        Py_SETREF(list, Py_NewRef(s->list));
    return list;
}

/* append(entry): a Python caller's entry (the oldest drops out of a full ring) */
static PyObject *Ring_append(NdRing *r, PyObject *entry)
{
    uint64_t n = ++r->count;
    NdSlot *s = nd_ring_slot(r, n);
    PyObject *old = s->list;
    s->n = n;
    s->list = Py_NewRef(entry);
    Py_XDECREF(old);
    Py_RETURN_NONE;
}

/* copy() -> the entries, oldest first: Python entries themselves, C slots as new 10-lists. The
 * slots are read first, then made into lists (making them may run the garbage collector, whose
 * finalizers may append meanwhile). */
static PyObject *Ring_copy(NdRing *r, PyObject *unused)
{
    uint64_t count = r->count, len = count < (uint64_t)r->maxlen ? count : (uint64_t)r->maxlen;
    NdSlot *snap = PyMem_Malloc((len ? len : 1) * sizeof(NdSlot));
    if (!snap)
        return PyErr_NoMemory();
    for (uint64_t i = 0; i < len; i++) {
        snap[i] = *nd_ring_slot(r, count - len + 1 + i);
        Py_XINCREF(snap[i].list);
    }
    PyObject *out = PyList_New((Py_ssize_t)len);
    for (uint64_t i = 0; i < len; i++) {
        PyObject *e = snap[i].list;
        if (out && !e)
            e = as_list(r, &snap[i]);
        else
            snap[i].list = NULL; /* (the reference moves to ``out``) */
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
    return r->count < (uint64_t)r->maxlen ? (Py_ssize_t)r->count : r->maxlen;
}

static PyMethodDef Ring_methods[] = {
    {"append", (PyCFunction)Ring_append, METH_O, "append(entry): the oldest drops out of a full ring"},
    {"copy", (PyCFunction)Ring_copy, METH_NOARGS, "copy() -> the entries as lists, oldest first"},
    {NULL, NULL, 0, NULL},
};
static PyMemberDef Ring_members[] = {
    {"maxlen", T_PYSSIZET, offsetof(NdRing, maxlen), READONLY, "how many entries it keeps"},
    {"count", T_ULONGLONG, offsetof(NdRing, count), READONLY, "entries appended so far"},
    {NULL, 0, 0, 0, NULL},
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
