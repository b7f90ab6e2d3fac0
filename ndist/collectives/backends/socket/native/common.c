/* What ndist's two native engines share: see common.h. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "common.h"
#include "kernels.h"

const char *const ND_E_NAMES[] = {"ok", "timeout", "dead", "failed", "closed", "mismatch", "self_closed",
                                  "signal", "python", "self_failed", "stalled", "cma", "lost", "abort", "news"};


/* dst = a (op) b over count elements; GIL released (re-taken for the fallback) */
int do_reduce(Red *r, char *dst, const char *a, const char *b, size_t count, PyThreadState **save)
{
    if (!count)
        return E_OK;
    if (nd_reduce(dst, a, b, count, r->dtype, r->redop) == 0)
        return E_OK;
    if (!r->fallback || r->fallback == Py_None)
        return E_PY; /* checked before any byte moved; cannot happen */
    PyEval_RestoreThread(*save);
    Py_ssize_t nb = (Py_ssize_t)count * r->esize;
    PyObject *d = PyMemoryView_FromMemory(dst, nb, PyBUF_WRITE);
    PyObject *x = PyMemoryView_FromMemory((char *)a, nb, PyBUF_READ);
    PyObject *y = PyMemoryView_FromMemory((char *)b, nb, PyBUF_READ);
    PyObject *res = NULL;
    if (d && x && y)
        res = PyObject_CallFunctionObjArgs(r->fallback, d, x, y, NULL);
    Py_XDECREF(d);
    Py_XDECREF(x);
    Py_XDECREF(y);
    int rc = res ? E_OK : E_PY;
    Py_XDECREF(res);
    *save = PyEval_SaveThread();
    return rc;
}


PyObject *nd_take_exception(void)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (value && tb)
        PyException_SetTraceback(value, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return value;
}


int get_buf(PyObject *o, Py_buffer *b, int writable)
{
    return PyObject_GetBuffer(o, b, (writable ? PyBUF_WRITABLE : 0) | PyBUF_C_CONTIGUOUS);
}


int red_init(Red *r, int dtype, int redop, Py_ssize_t esize, PyObject *fallback)
{
    r->dtype = dtype;
    r->redop = redop;
    r->esize = esize;
    r->fallback = fallback;
    if (esize <= 0 || ND_ALIGN % esize) {
        PyErr_Format(PyExc_ValueError, "element size %zd does not divide %d", esize, ND_ALIGN);
        return -1;
    }
    if ((!fallback || fallback == Py_None) && nd_reduce(NULL, NULL, NULL, 0, dtype, redop) < 0) {
        PyErr_Format(PyExc_ValueError, "no native kernel for dtype %d op %d and no fallback", dtype, redop);
        return -1;
    }
    return 0;
}

int red_args(PyObject *args, const char *fmt, Red *r, Py_buffer *b, int *last)
{
    PyObject *o, *fb;
    int dtype, redop;
    Py_ssize_t esize;
    if (!PyArg_ParseTuple(args, fmt, &o, &dtype, &redop, &esize, &fb, last))
        return -1;
    if (red_init(r, dtype, redop, esize, fb) < 0 || get_buf(o, b, 1) < 0)
        return -1;
    return 0;
}

void held_release(Held *h)
{
    if (h->views)
        for (int i = 0; i < h->n; i++)
            if (h->views[i].obj)
                PyBuffer_Release(&h->views[i]);
    PyMem_Free(h->views);
    PyMem_Free(h->ptr);
    PyMem_Free(h->len);
    h->views = NULL;
    h->ptr = NULL;
    h->len = NULL;
}

int held_get(Held *h, PyObject *seq, int n, int writable)
{
    h->n = n;
    h->views = PyMem_Calloc(n, sizeof(Py_buffer));
    h->ptr = PyMem_Calloc(n, sizeof(char *));
    h->len = PyMem_Calloc(n, sizeof(Py_ssize_t));
    if (!h->views || !h->ptr || !h->len) {
        held_release(h);
        PyErr_NoMemory();
        return -1;
    }
    if (seq == Py_None)
        return 0;
    if (!PyList_Check(seq) && !PyTuple_Check(seq) && PyObject_CheckBuffer(seq)) {
        /* one buffer for all n: n equal parts of it (the single-buffer forms without
         * splits: all_gather_into, reduce_scatter_from, all_to_all_single), no views */
        if (get_buf(seq, &h->views[0], writable) < 0) {
            held_release(h);
            return -1;
        }
        Py_ssize_t part = h->views[0].len / n;
        if (part * n != h->views[0].len) {
            PyErr_Format(PyExc_ValueError, "a buffer of %zd bytes does not split into %d equal parts",
                         h->views[0].len, n);
            held_release(h);
            return -1;
        }
        for (int i = 0; i < n; i++) {
            h->ptr[i] = (char *)h->views[0].buf + i * part;
            h->len[i] = part;
        }
        return 0;
    }
    PyObject *fast = PySequence_Fast(seq, "expected a list of buffers");
    if (!fast) {
        held_release(h);
        return -1;
    }
    if (PySequence_Fast_GET_SIZE(fast) != n) {
        Py_DECREF(fast);
        held_release(h);
        PyErr_Format(PyExc_ValueError, "expected %d buffers", n);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        if (get_buf(PySequence_Fast_GET_ITEM(fast, i), &h->views[i], writable) < 0) {
            Py_DECREF(fast);
            held_release(h);
            return -1;
        }
        h->ptr[i] = h->views[i].buf;
        h->len[i] = h->views[i].len;
    }
    Py_DECREF(fast);
    return 0;
}


/* h: n absent buffers (held_get of None); take ``buf`` and cut it at ``counts`` (n element
 * counts of ``esize`` bytes, in order from its start). On failure the caller releases h. */
int held_cut(Held *h, PyObject *buf, PyObject *counts, Py_ssize_t esize, int writable)
{
    PyObject *fast = PySequence_Fast(counts, "expected a list of counts");
    if (!fast)
        return -1;
    if (PySequence_Fast_GET_SIZE(fast) != h->n || esize <= 0) {
        PyErr_Format(PyExc_ValueError, "expected %d counts and an element size > 0", h->n);
        Py_DECREF(fast);
        return -1;
    }
    if (get_buf(buf, &h->views[0], writable) < 0) {
        Py_DECREF(fast);
        return -1;
    }
    Py_ssize_t off = 0, len = h->views[0].len;
    for (int i = 0; i < h->n; i++) {
        Py_ssize_t c = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(fast, i));
        if (c == -1 && PyErr_Occurred()) {
            Py_DECREF(fast);
            return -1;
        }
        if (c < 0 || c > (len - off) / esize) {
            PyErr_Format(PyExc_ValueError, "counts past the end of a buffer of %zd bytes", len);
            Py_DECREF(fast);
            return -1;
        }
        h->ptr[i] = (char *)h->views[0].buf + off;
        h->len[i] = c * esize;
        off += c * esize;
    }
    Py_DECREF(fast);
    return 0;
}
