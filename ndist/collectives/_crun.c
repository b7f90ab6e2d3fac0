/* The repeated call's bookkeeping in C: ``run_fields``, the twin of
 * ``ndist.collectives._common.run_fields``, which the public
 * layer's plain paths (_api.py) call for every blocking collective on the same buffers.
 *
 * It builds the call record (a ``Call``, from its 13 fields in order), numbers the call,
 * writes the flight recorder's entry, runs the NDIST_DEBUG=DETAIL check, calls the
 * backend's method with ``blocking=True`` and waits for a Work it returns, and records
 * the outcome: the same steps, in the same order, as the Python function. The Python one
 * stays the reference and the fallback (no compiler, or ``NDIST_ENGINE=python``); the
 * conformance suite runs both. What it saves is the interpreter's work per call: the
 * record's tuple copy, the entry list and two ``time.time()`` calls, the keyword call
 * (docs/performance.md in git history, "The public layer in C", 2026-11-24).
 *
 * Everything here runs with the GIL held and touches only Python objects: no shared
 * memory, no atomics. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <time.h>

#define NFIELDS 13 /* Call's fields: op device dtype out inp outputs inputs out_splits in_splits root redop scale tag */
#define F_OP 0
#define F_DEVICE 1
#define F_DTYPE 2
#define F_ROOT 9
#define ENTRY_LEN 10 /* the flight recorder's entry: _debug.py's _FIELDS */

static PyTypeObject *call_type; /* _backend.Call */
static PyObject *done_work;     /* _backend.DONE */
static PyObject *check_signature, *failed, *wait_sync;
static Py_ssize_t t_done = -1;  /* _debug.T_DONE */
static PyObject *kw_blocking;

/* time.time(): CLOCK_REALTIME in seconds, as Python computes it */
static PyObject *now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return PyFloat_FromDouble((double)((long long)ts.tv_sec * 1000000000LL + ts.tv_nsec) / 1e9);
}

static PyObject *setup(PyObject *mod, PyObject *args)
{
    PyObject *ct, *dn, *cs, *fl, *ws;
    Py_ssize_t td;
    if (!PyArg_ParseTuple(args, "O!OOOOn:setup", &PyType_Type, &ct, &dn, &cs, &fl, &ws, &td))
        return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)ct, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "setup: Call must be a tuple type");
        return NULL;
    }
    if (td < 0 || td >= ENTRY_LEN) {
        PyErr_Format(PyExc_ValueError, "setup: T_DONE must be in [0, %d), got %zd", ENTRY_LEN, td);
        return NULL;
    }
    Py_XSETREF(call_type, (PyTypeObject *)Py_NewRef(ct));
    Py_XSETREF(done_work, Py_NewRef(dn));
    Py_XSETREF(check_signature, Py_NewRef(cs));
    Py_XSETREF(failed, Py_NewRef(fl));
    Py_XSETREF(wait_sync, Py_NewRef(ws));
    t_done = td;
    Py_RETURN_NONE;
}

/* run_fields(book, method, count_in, count_out, *fields): see _common.run_fields */
static PyObject *run_fields(PyObject *mod, PyObject *const *a, Py_ssize_t n)
{
    if (call_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "run_fields: setup() was not called");
        return NULL;
    }
    if (n != 4 + NFIELDS) {
        PyErr_Format(PyExc_TypeError, "run_fields: expected %d arguments, got %zd", 4 + NFIELDS, n);
        return NULL;
    }
    PyObject *book = a[0], *method = a[1], *const *f = a + 4;
    if (!PyTuple_CheckExact(book) || PyTuple_GET_SIZE(book) != 5) {
        PyErr_SetString(PyExc_TypeError, "run_fields: book must be a Lane's book (a 5-tuple)");
        return NULL;
    }
    /* seqs, record (None: no flight recorder), detail, pg, rec: borrowed from the book */
    PyObject *seqs = PyTuple_GET_ITEM(book, 0), *record = PyTuple_GET_ITEM(book, 1),
             *detail = PyTuple_GET_ITEM(book, 2), *pg = PyTuple_GET_ITEM(book, 3), *rec = PyTuple_GET_ITEM(book, 4);
    PyObject *call = NULL, *seq = NULL, *entry = NULL, *work = NULL, *r = NULL, *ok;

    call = call_type->tp_alloc(call_type, NFIELDS);
    if (call == NULL)
        return NULL;
    for (int i = 0; i < NFIELDS; i++)
        PyTuple_SET_ITEM(call, i, Py_NewRef(f[i]));

    if ((seq = PyIter_Next(seqs)) == NULL) { /* seq = next(seqs) */
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "run_fields: the sequence counter ended");
        goto out;
    }
    if (record != Py_None) { /* entry = [seq, op, device, dtype, count_in, count_out, root, time(), None, None] */
        PyObject *t = now();
        if (t == NULL)
            goto out;
        if ((entry = PyList_New(ENTRY_LEN)) == NULL) {
            Py_DECREF(t);
            goto out;
        }
        PyObject *items[ENTRY_LEN] = {seq, f[F_OP], f[F_DEVICE], f[F_DTYPE], a[2], a[3], f[F_ROOT], NULL,
                                      Py_None, Py_None};
        for (int i = 0; i < ENTRY_LEN; i++)
            PyList_SET_ITEM(entry, i, i == 7 ? t : Py_NewRef(items[i]));
        if ((ok = PyObject_CallOneArg(record, entry)) == NULL)
            goto out;
        Py_DECREF(ok);
    }
    /* from here on a failure is recorded in the entry (Python's try: ... except BaseException) */
    int check = PyObject_IsTrue(detail);
    if (check < 0)
        goto fail;
    if (check) {
        if ((ok = PyObject_CallFunctionObjArgs(check_signature, pg, seq, call, NULL)) == NULL)
            goto fail;
        Py_DECREF(ok);
    }
    PyObject *margs[3] = {NULL, call, Py_True}; /* method(call, blocking=True) */
    if ((work = PyObject_Vectorcall(method, margs + 1, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, kw_blocking)) == NULL)
        goto fail;
    if (work != done_work) {
        if ((ok = PyObject_CallFunctionObjArgs(wait_sync, work, pg, NULL)) == NULL)
            goto fail;
        Py_DECREF(ok);
    }
    if (entry != NULL) { /* entry[T_DONE] = time() */
        PyObject *t = now();
        if (t == NULL)
            goto out;
        PyList_SetItem(entry, t_done, t); /* steals t; the old item is None */
    }
    r = Py_NewRef(Py_None);
    goto out;

fail: {
        /* _failed(rec, entry, seq, exc), then the error again (a failure in _failed wins, as in Python) */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        if (tb != NULL && value != NULL)
            PyException_SetTraceback(value, tb);
        ok = PyObject_CallFunctionObjArgs(failed, rec, entry != NULL ? entry : Py_None, seq,
                                          value != NULL ? value : Py_None, NULL);
        if (ok == NULL) { /* the new error, with the op's as its context */
            if (value != NULL) {
                PyObject *t2, *v2, *tb2;
                PyErr_Fetch(&t2, &v2, &tb2);
                PyErr_NormalizeException(&t2, &v2, &tb2);
                if (v2 != NULL) {
                    PyException_SetContext(v2, Py_NewRef(value));
                    if (tb2 != NULL)
                        PyException_SetTraceback(v2, tb2);
                }
                PyErr_Restore(t2, v2, tb2);
            }
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
        } else {
            Py_DECREF(ok);
            PyErr_Restore(type, value, tb);
        }
    }
out:
    Py_XDECREF(work);
    Py_XDECREF(entry);
    Py_XDECREF(seq);
    Py_XDECREF(call);
    return r;
}

static PyMethodDef methods[] = {
    {"setup", (PyCFunction)setup, METH_VARARGS,
     "setup(Call, DONE, check_signature, failed, wait_sync, T_DONE): what run_fields uses"},
    {"run_fields", (PyCFunction)(void (*)(void))run_fields, METH_FASTCALL,
     "run_fields(book, method, count_in, count_out, *fields): _common.run_fields in C"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_crun", "The repeated call's bookkeeping in C.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__crun(void)
{
    if (kw_blocking == NULL && (kw_blocking = Py_BuildValue("(s)", "blocking")) == NULL)
        return NULL;
    return PyModule_Create(&module);
}
