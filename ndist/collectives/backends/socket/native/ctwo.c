/* The two-level group in C (``_cnative.TwoGroup``; native/_twolevel.py, docs/native.md "Two
 * levels"): a group that spans hosts with more than one rank on some host runs each op as steps
 * on two compiled groups, ``local`` (a same-host ``Group`` over this host's ranks, cnative.c; NULL
 * when this rank is alone on its host) and ``tcp`` (a ``TcpGroup`` over every rank, ctcp.c, whose
 * view narrows a step to the leaders: the lowest group rank of each host, in host order, so the
 * leader of host h is the view's rank h).
 *
 * ``nd_two_run`` (engines.h) runs one op's steps with the GIL released, the same code for the
 * Python methods here (``TwoLevelGroup``'s ops), FastLane (clane.c) and the C interface (capi.c):
 *
 *   all_reduce: local reduce to the leader, the leaders' all_reduce, local broadcast from it;
 *   broadcast: on the root's host a local broadcast from the root, then the leaders' broadcast;
 *     on the other hosts the leaders' broadcast, then a local one;
 *   reduce: as all_reduce's first two steps (a leader that is not the root reduces into a copy:
 *     a non-root's buffer is never written), then, when the root is not its host's leader, a
 *     local scatter that gives the root alone the result;
 *   all_gather (one output of ``size`` equal blocks): a local all_gather of the host's blocks,
 *     the leaders' exchange of whole host blocks (an uneven all_to_all among them), then local
 *     broadcasts of the other hosts' blocks (those before this host's, those after). The blocks
 *     lie in host order: in the output itself when every host's ranks are consecutive, else in a
 *     copy kept by the group (``spare``), unpacked at the end;
 *   barrier: local barrier, the leaders' barrier, local barrier;
 *   all_to_all, reduce_scatter: direct, on the whole TCP group.
 *
 * A call of fewer than ``min`` bytes (all_gather: its output, below ``gather_min``) runs direct on
 * the whole TCP group, as does every barrier unless ``min`` is 0. Every step carries the call's
 * tag (its op above bit 8, its root + 1 above bit 16) in its op code, so two calls whose steps look
 * alike do not pass for one. A step that fails returns its code and records which group failed;
 * ``nd_two_raise`` (with the GIL) raises that group's error and hands it to ``failure(err,
 * from_local)`` (``TwoLevelGroup._failure``), which renumbers it to the group's ranks, fails the
 * other group naming the same rank and raises the result: the failure path stays in Python, a
 * call that succeeds runs none. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "engines.h"

typedef struct {
    PyObject_HEAD
    PyObject *local, *tcp; /* the same-host Group (NULL: alone on this host), the TcpGroup */
    PyObject *failure;     /* failure(err, from_local): raises the step's error mapped */
    int rank, size, nh, host, lsize, leader, identity;
    int *hosts;   /* size: each group rank's host */
    int *pos;     /* size: each group rank's place in host order */
    int *hstart;  /* nh: host h's first place in host order */
    int *hcount;  /* nh: its rank count */
    int *leaders; /* nh: its lowest group rank */
    Py_ssize_t min, gather_min;
    int tag, view;    /* what the groups carry now (tag -1: not set yet; view 1: the leaders) */
    int failed_local; /* the failing step's group: 1 local, 0 TCP, -1 none (this group's memory) */
    _Atomic int level; /* the running (or last) step's group: 0 none, 1 TCP, 2 local (read by another
                        * thread's message, ``level``: common.h, ND_SET) */
    char *spare;      /* reduce's copy, all_gather's blocks in host order */
    size_t spare_len;
    char **bp;        /* 2 * nh: the leaders' exchange blocks */
    Py_ssize_t *bl;
    int *order;       /* size: the group rank at each place in host order */
    char **gp;        /* size: all_gather's blocks (the local step's, or the direct step's) */
    Py_ssize_t *gl;   /* size: each rank's block length */
    Py_ssize_t *ll;   /* size: the local step's block lengths */
    Py_ssize_t *goff; /* size: each rank's block offset in the output */
    Py_ssize_t *toff; /* size: each place's block offset in host order */
} Two;

static PyTypeObject TwoType;

/* ------------------------------------------------------------------ steps */
static int shm(Two *t, const NdOp *op, PyThreadState **sv)
{
    ND_SET(t->level, 2);
    int rc = nd_shm_run(t->local, op, sv);
    if (rc)
        t->failed_local = 1;
    return rc;
}

static int tcp(Two *t, const NdOp *op, char **outs, Py_ssize_t *olen, char **ins, Py_ssize_t *ilen,
               PyThreadState **sv)
{
    ND_SET(t->level, 1);
    int rc = nd_tcp_step(t->tcp, op, outs, olen, ins, ilen, sv);
    if (rc)
        t->failed_local = 0;
    return rc;
}

static int scatter_to(Two *t, int to, char *buf, Py_ssize_t nbytes, int dtype, PyThreadState **sv)
{
    ND_SET(t->level, 2);
    int rc = nd_shm_scatter_to(t->local, to, buf, nbytes, dtype, sv);
    if (rc)
        t->failed_local = 1;
    return rc;
}

/* the TCP group's view: the leaders (1) or every rank (0) */
static int view(Two *t, int leaders)
{
    if (t->view == leaders)
        return E_OK;
    if (nd_tcp_set_view(t->tcp, leaders ? t->leaders : NULL, t->nh) < 0)
        return ND_SHM_NOMEM;
    t->view = leaders;
    return E_OK;
}

static void set_tag(Two *t, int tag)
{
    if (t->tag == tag)
        return;
    t->tag = tag;
    nd_tcp_set_tag(t->tcp, tag);
    if (t->local)
        nd_shm_set_tag(t->local, tag);
}

static int grow(Two *t, size_t need)
{
    if (t->spare_len >= need)
        return 0;
    char *p = malloc(need);
    if (!p)
        return -1;
    free(t->spare);
    t->spare = p, t->spare_len = need;
    return 0;
}

#define TRY(x)                                                                                                    \
    do {                                                                                                          \
        int rc_ = (x);                                                                                            \
        if (rc_)                                                                                                  \
            return rc_;                                                                                           \
    } while (0)

/* ------------------------------------------------------------------ the ops */
static int direct(Two *t, const NdOp *op, PyThreadState **sv)
{
    TRY(view(t, 0));
    return tcp(t, op, NULL, NULL, NULL, NULL, sv);
}

static int all_reduce(Two *t, const NdOp *op, PyThreadState **sv)
{
    if (op->outbytes < t->min)
        return direct(t, op, sv);
    TRY(view(t, 1));
    NdOp s = *op;
    if (t->local) {
        s.op = OP_REDUCE, s.root = 0, s.rsag = 0;
        TRY(shm(t, &s, sv));
    }
    if (t->leader)
        TRY(tcp(t, op, NULL, NULL, NULL, NULL, sv));
    if (t->local) {
        s.op = OP_BROADCAST, s.root = 0;
        TRY(shm(t, &s, sv));
    }
    return E_OK;
}

static int broadcast(Two *t, const NdOp *op, PyThreadState **sv)
{
    if (op->outbytes < t->min)
        return direct(t, op, sv);
    TRY(view(t, 1));
    int hr = t->hosts[op->root];
    NdOp s = *op;
    if (t->host == hr && t->local) {
        s.root = t->pos[op->root] - t->hstart[hr];
        TRY(shm(t, &s, sv));
    }
    if (t->leader) {
        s.root = hr;
        TRY(tcp(t, &s, NULL, NULL, NULL, NULL, sv));
    }
    if (t->host != hr && t->local) {
        s.root = 0;
        TRY(shm(t, &s, sv));
    }
    return E_OK;
}

static int reduce(Two *t, const NdOp *op, PyThreadState **sv)
{
    if (op->outbytes < t->min)
        return direct(t, op, sv);
    TRY(view(t, 1));
    int hr = t->hosts[op->root], root_leads = op->root == t->leaders[hr];
    NdOp s = *op;
    if (t->leader && t->rank != op->root && op->outbytes > 0) { /* (a non-root's buffer stays) */
        if (grow(t, (size_t)op->outbytes) < 0)
            return ND_SHM_NOMEM;
        memcpy(t->spare, op->out, (size_t)op->outbytes);
        s.out = t->spare;
    }
    if (t->local) {
        s.root = 0;
        TRY(shm(t, &s, sv));
    }
    if (t->leader) {
        s.root = hr;
        TRY(tcp(t, &s, NULL, NULL, NULL, NULL, sv));
    }
    if (t->host == hr && t->local && !root_leads) /* to the root alone */
        TRY(scatter_to(t, t->pos[op->root] - t->hstart[hr], s.out, s.outbytes, op->dtype, sv));
    return E_OK;
}

static int barrier(Two *t, const NdOp *op, PyThreadState **sv)
{
    if (t->min > 0) /* (no data: the direct one, unless every call goes in two levels) */
        return direct(t, op, sv);
    TRY(view(t, 1));
    if (t->local)
        TRY(shm(t, op, sv));
    if (t->leader)
        TRY(tcp(t, op, NULL, NULL, NULL, NULL, sv));
    if (t->local)
        TRY(shm(t, op, sv));
    return E_OK;
}

/* ``lens``: each rank's block (NULL: ``size`` equal ones) */
static int all_gather(Two *t, const NdOp *op, const Py_ssize_t *lens, PyThreadState **sv)
{
    int n = t->size, nh = t->nh, me = t->host, first = t->hstart[me];
    Py_ssize_t total = 0, *len = t->gl, *off = t->goff, *toff = t->toff;
    for (int r = 0; r < n; r++) {
        len[r] = lens ? lens[r] : op->outbytes / n;
        off[r] = total;
        total += len[r];
    }
    if (op->outbytes < t->gather_min || total == 0) {
        TRY(view(t, 0));
        for (int r = 0; r < n; r++)
            t->gp[r] = op->out + off[r];
        return tcp(t, op, t->gp, len, NULL, NULL, sv);
    }
    TRY(view(t, 1));
    char *T = op->out; /* every block in host order */
    if (!t->identity) {
        if (grow(t, (size_t)total) < 0)
            return ND_SHM_NOMEM;
        T = t->spare;
    }
    Py_ssize_t at = 0;
    for (int p = 0; p < n; p++) {
        toff[p] = at;
        at += len[t->order[p]];
    }
    char *span = T + toff[first]; /* this host's blocks */
    Py_ssize_t slen = 0;
    for (int i = 0; i < t->lsize; i++)
        slen += len[t->order[first + i]];
    NdOp s = *op;
    if (t->local) {
        for (int i = 0; i < t->lsize; i++)
            t->gp[i] = T + toff[first + i], t->ll[i] = len[t->order[first + i]];
        ND_SET(t->level, 2);
        int rc = nd_shm_all_gather(t->local, t->gp, t->ll, op->in, op->inbytes, op->dtype, sv);
        if (rc) {
            t->failed_local = 1;
            return rc;
        }
    } else if (span != op->in && len[t->rank]) {
        memmove(span, op->in, (size_t)len[t->rank]);
    }
    if (t->leader) {
        for (int h = 0; h < nh; h++) {
            Py_ssize_t hb = 0;
            for (int i = 0; i < t->hcount[h]; i++)
                hb += len[t->order[t->hstart[h] + i]];
            t->bp[h] = T + toff[t->hstart[h]], t->bl[h] = hb;
            t->bp[nh + h] = span, t->bl[nh + h] = slen;
        }
        s.op = OP_ALL_TO_ALL, s.out = T, s.outbytes = total, s.in = span, s.inbytes = slen;
        TRY(tcp(t, &s, t->bp, t->bl, t->bp + nh, t->bl + nh, sv));
    }
    if (t->local && n > t->lsize) { /* the other hosts' blocks: those before this host's, those after */
        Py_ssize_t before = toff[first], after = total - before - slen;
        s.op = OP_BROADCAST, s.root = 0;
        if (before) {
            s.out = T, s.outbytes = before;
            TRY(shm(t, &s, sv));
        }
        if (after) {
            s.out = span + slen, s.outbytes = after;
            TRY(shm(t, &s, sv));
        }
    }
    if (!t->identity)
        for (int r = 0; r < n; r++)
            if (len[r])
                memcpy(op->out + off[r], T + toff[t->pos[r]], (size_t)len[r]);
    return E_OK;
}

/* ------------------------------------------------------------------ the C interface's entry (engines.h) */
int nd_two_is(PyObject *o) { return Py_TYPE(o) == &TwoType; }

void nd_two_geometry(PyObject *o, int *rank, int *size)
{
    *rank = ((Two *)o)->rank;
    *size = ((Two *)o)->size;
}

void nd_two_set_seq(PyObject *o, unsigned long long seq)
{
    Two *t = (Two *)o;
    nd_tcp_set_seq(t->tcp, seq);
    if (t->local)
        nd_shm_set_seq(t->local, seq);
}

int nd_two_run(PyObject *o, const NdOp *op, PyThreadState **sv)
{
    Two *t = (Two *)o;
    t->failed_local = -1;
    ND_SET(t->level, 0);
    if (!t->tcp)
        return ND_SHM_BROKEN;
    int root = op->op == OP_BROADCAST || op->op == OP_REDUCE ? op->root : -1;
    set_tag(t, op->op << 8 | (root + 1) << 16);
    switch (op->op) {
    case OP_ALL_REDUCE:
        return all_reduce(t, op, sv);
    case OP_BROADCAST:
        return broadcast(t, op, sv);
    case OP_REDUCE:
        return reduce(t, op, sv);
    case OP_BARRIER:
        return barrier(t, op, sv);
    case OP_ALL_GATHER:
        return all_gather(t, op, NULL, sv);
    default: /* all_to_all, reduce_scatter */
        return direct(t, op, sv);
    }
}

int nd_two_all_gather(PyObject *o, const NdOp *op, const Py_ssize_t *lens, PyThreadState **sv)
{
    Two *t = (Two *)o;
    t->failed_local = -1;
    ND_SET(t->level, 0);
    if (!t->tcp)
        return ND_SHM_BROKEN;
    set_tag(t, OP_ALL_GATHER << 8);
    return all_gather(t, op, lens, sv);
}

PyObject *nd_two_raise(PyObject *o, int rc)
{
    Two *t = (Two *)o;
    int local = t->failed_local;
    if (local < 0 || !t->tcp) { /* nothing ran: this group's own memory, or closed */
        if (rc == ND_SHM_NOMEM)
            return PyErr_NoMemory();
        PyErr_SetString(PyExc_RuntimeError, "native group is broken by an earlier failure");
        return NULL;
    }
    if (local)
        nd_shm_raise(t->local, rc);
    else
        nd_tcp_raise(t->tcp, rc);
    if (!t->failure || !PyErr_Occurred())
        return NULL;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (value && tb)
        PyException_SetTraceback(value, tb);
    PyObject *r = value ? PyObject_CallFunction(t->failure, "Oi", value, local) : NULL;
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    if (r) {
        Py_DECREF(r);
        PyErr_SetString(PyExc_RuntimeError, "TwoGroup: the failure hook returned instead of raising");
    }
    return NULL;
}

/* ------------------------------------------------------------------ the Python methods */
static PyObject *call(Two *t, const NdOp *op)
{
    PyThreadState *sv = PyEval_SaveThread();
    int rc = nd_two_run((PyObject *)t, op, &sv);
    PyEval_RestoreThread(sv);
    if (rc)
        return nd_two_raise((PyObject *)t, rc);
    Py_RETURN_NONE;
}

static int check_root(Two *t, const char *what, int root)
{
    if (root < 0 || root >= t->size) {
        PyErr_Format(PyExc_ValueError, "%s: expected a group rank in [0, %d), got %d", what, t->size, root);
        return -1;
    }
    return 0;
}

static PyObject *Two_all_reduce(Two *t, PyObject *args)
{
    Red r;
    Py_buffer b;
    int rsag;
    if (red_args(args, "OiinOp", &r, &b, &rsag) < 0)
        return NULL;
    NdOp op = {.op = OP_ALL_REDUCE, .dtype = r.dtype, .redop = r.redop, .root = -1, .rsag = rsag, .esize = r.esize,
               .fallback = r.fallback, .out = b.buf, .outbytes = b.len};
    PyObject *res = call(t, &op);
    PyBuffer_Release(&b);
    return res;
}

static PyObject *Two_reduce(Two *t, PyObject *args)
{
    Red r;
    Py_buffer b;
    int root;
    if (red_args(args, "OiinOi", &r, &b, &root) < 0)
        return NULL;
    if (check_root(t, "reduce: root", root) < 0) {
        PyBuffer_Release(&b);
        return NULL;
    }
    NdOp op = {.op = OP_REDUCE, .dtype = r.dtype, .redop = r.redop, .root = root, .esize = r.esize,
               .fallback = r.fallback, .out = b.buf, .outbytes = b.len};
    PyObject *res = call(t, &op);
    PyBuffer_Release(&b);
    return res;
}

static PyObject *Two_broadcast(Two *t, PyObject *args)
{
    PyObject *buf;
    int dtype, root;
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "Oii", &buf, &dtype, &root) || check_root(t, "broadcast: root", root) < 0 ||
        get_buf(buf, &b, 1) < 0)
        return NULL;
    NdOp op = {.op = OP_BROADCAST, .dtype = dtype, .root = root, .out = b.buf, .outbytes = b.len};
    PyObject *res = call(t, &op);
    PyBuffer_Release(&b);
    return res;
}

static PyObject *Two_barrier(Two *t, PyObject *noargs)
{
    NdOp op = {.op = OP_BARRIER, .root = -1};
    return call(t, &op);
}

static PyObject *Two_all_gather(Two *t, PyObject *args)
{
    PyObject *out, *inp, *lens = Py_None;
    int dtype;
    Py_buffer bo, bi;
    if (!PyArg_ParseTuple(args, "OOi|O", &out, &inp, &dtype, &lens) || get_buf(out, &bo, 1) < 0)
        return NULL;
    if (get_buf(inp, &bi, 0) < 0) {
        PyBuffer_Release(&bo);
        return NULL;
    }
    PyObject *res = NULL;
    Py_ssize_t total = 0;
    if (lens != Py_None) { /* each rank's block, in bytes */
        PyObject *fast = PySequence_Fast(lens, "all_gather: lens: expected a sequence of byte counts");
        if (!fast)
            goto done;
        if (PySequence_Fast_GET_SIZE(fast) != t->size) {
            PyErr_Format(PyExc_ValueError, "all_gather: lens: expected %d byte counts, got %zd", t->size,
                         PySequence_Fast_GET_SIZE(fast));
            Py_DECREF(fast);
            goto done;
        }
        for (int r = 0; r < t->size; r++) {
            Py_ssize_t k = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(fast, r));
            if (k == -1 && PyErr_Occurred()) {
                Py_DECREF(fast);
                goto done;
            }
            if (k < 0) {
                PyErr_Format(PyExc_ValueError, "all_gather: lens[%d]: expected a byte count >= 0, got %zd", r, k);
                Py_DECREF(fast);
                goto done;
            }
            t->gl[r] = k;
            total += k;
        }
        Py_DECREF(fast);
        if (t->gl[t->rank] != bi.len) {
            PyErr_Format(PyExc_ValueError, "all_gather: lens[%d]: expected the input's %zd bytes, got %zd", t->rank,
                         bi.len, t->gl[t->rank]);
            goto done;
        }
    } else
        total = bi.len * t->size;
    if (bo.len != total) {
        PyErr_Format(PyExc_ValueError, "all_gather: expected an output of %zd bytes, got %zd", total, bo.len);
        goto done;
    }
    NdOp op = {.op = OP_ALL_GATHER, .dtype = dtype, .root = -1, .out = bo.buf, .outbytes = bo.len,
               .in = bi.buf, .inbytes = bi.len};
    Py_ssize_t *given = NULL;
    if (lens != Py_None) { /* (all_gather overwrites gl: a copy) */
        given = PyMem_Malloc((size_t)t->size * sizeof(Py_ssize_t));
        if (!given) {
            PyErr_NoMemory();
            goto done;
        }
        memcpy(given, t->gl, (size_t)t->size * sizeof(Py_ssize_t));
    }
    PyThreadState *sv = PyEval_SaveThread();
    int rc = nd_two_all_gather((PyObject *)t, &op, given, &sv);
    PyEval_RestoreThread(sv);
    PyMem_Free(given);
    if (rc)
        nd_two_raise((PyObject *)t, rc);
    else
        res = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&bi);
    PyBuffer_Release(&bo);
    return res;
}

/* direct(op, root): the next op runs direct on the whole TCP group (its view every rank, both
 * groups tagged with the call): what the Python methods of the list ops run before theirs */
static PyObject *Two_direct(Two *t, PyObject *args)
{
    int op, root;
    if (!PyArg_ParseTuple(args, "ii", &op, &root))
        return NULL;
    if (!t->tcp) {
        PyErr_SetString(PyExc_RuntimeError, "native group is broken by an earlier failure");
        return NULL;
    }
    set_tag(t, op << 8 | (root + 1) << 16);
    ND_SET(t->level, 1);
    if (view(t, 0))
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* close(): the hook let go (the groups are closed by their owner) */
static PyObject *Two_close(Two *t, PyObject *noargs)
{
    Py_CLEAR(t->failure);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ the type */
static int Two_traverse(Two *t, visitproc visit, void *arg)
{
    Py_VISIT(t->local);
    Py_VISIT(t->tcp);
    Py_VISIT(t->failure);
    return 0;
}

static int Two_clear(Two *t)
{
    Py_CLEAR(t->local);
    Py_CLEAR(t->tcp);
    Py_CLEAR(t->failure);
    return 0;
}

static void Two_free_arrays(Two *t)
{
    PyMem_Free(t->hosts);
    PyMem_Free(t->pos);
    PyMem_Free(t->hstart);
    PyMem_Free(t->hcount);
    PyMem_Free(t->leaders);
    PyMem_Free(t->bp);
    PyMem_Free(t->bl);
    PyMem_Free(t->order);
    PyMem_Free(t->gp);
    PyMem_Free(t->gl);
    PyMem_Free(t->ll);
    PyMem_Free(t->goff);
    PyMem_Free(t->toff);
    t->hosts = t->pos = t->hstart = t->hcount = t->leaders = t->order = NULL;
    t->bp = t->gp = NULL;
    t->bl = t->gl = t->ll = t->goff = t->toff = NULL;
}

static void Two_dealloc(Two *t)
{
    PyObject_GC_UnTrack(t);
    Two_clear(t);
    Two_free_arrays(t);
    free(t->spare);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

/* TwoGroup(local or None, tcp, hosts, rank, min, gather_min, failure): ``hosts`` the host index of
 * each group rank, hosts numbered in the order of their lowest rank */
static int Two_init(Two *t, PyObject *args, PyObject *kw)
{
    PyObject *local, *tcpg, *hosts, *failure;
    int rank;
    Py_ssize_t min, gather_min;
    if (!PyArg_ParseTuple(args, "OOOinnO:TwoGroup", &local, &tcpg, &hosts, &rank, &min, &gather_min, &failure))
        return -1;
    if (!nd_tcp_is(tcpg) || (local != Py_None && !nd_shm_is(local)) || !PyCallable_Check(failure)) {
        PyErr_Format(PyExc_TypeError, "TwoGroup: expected a Group or None, a TcpGroup and a callable, got %s, %s, %s",
                     Py_TYPE(local)->tp_name, Py_TYPE(tcpg)->tp_name, Py_TYPE(failure)->tp_name);
        return -1;
    }
    PyObject *fast = PySequence_Fast(hosts, "TwoGroup: hosts: expected a sequence of host indices");
    if (!fast)
        return -1;
    Two_clear(t);
    Two_free_arrays(t);
    int n = (int)PySequence_Fast_GET_SIZE(fast), trank, tsize, nh = 0;
    nd_tcp_geometry(tcpg, &trank, &tsize);
    if (n != tsize || rank != trank) {
        PyErr_Format(PyExc_ValueError, "TwoGroup: expected %d hosts and rank %d (the TcpGroup's), got %d and %d",
                     tsize, trank, n, rank);
        goto bad;
    }
    t->hosts = PyMem_Calloc((size_t)n, sizeof(int));
    t->pos = PyMem_Calloc((size_t)n, sizeof(int));
    t->order = PyMem_Calloc((size_t)n, sizeof(int));
    t->gp = PyMem_Calloc((size_t)n, sizeof(char *));
    t->gl = PyMem_Calloc((size_t)n, sizeof(Py_ssize_t));
    t->ll = PyMem_Calloc((size_t)n, sizeof(Py_ssize_t));
    t->goff = PyMem_Calloc((size_t)n, sizeof(Py_ssize_t));
    t->toff = PyMem_Calloc((size_t)n, sizeof(Py_ssize_t));
    if (!t->hosts || !t->pos || !t->order || !t->gp || !t->gl || !t->ll || !t->goff || !t->toff) {
        PyErr_NoMemory();
        goto bad;
    }
    for (int r = 0; r < n; r++) {
        long h = PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, r));
        if (h == -1 && PyErr_Occurred())
            goto bad;
        if (h < 0 || h > nh) { /* (hosts numbered in the order of their lowest rank) */
            PyErr_Format(PyExc_ValueError, "TwoGroup: hosts[%d]: expected a host index in [0, %d], got %ld", r, nh, h);
            goto bad;
        }
        if (h == nh)
            nh++;
        t->hosts[r] = (int)h;
    }
    t->nh = nh;
    t->hstart = PyMem_Calloc((size_t)nh, sizeof(int));
    t->hcount = PyMem_Calloc((size_t)nh, sizeof(int));
    t->leaders = PyMem_Calloc((size_t)nh, sizeof(int));
    t->bp = PyMem_Calloc(2 * (size_t)nh, sizeof(char *));
    t->bl = PyMem_Calloc(2 * (size_t)nh, sizeof(Py_ssize_t));
    if (!t->hstart || !t->hcount || !t->leaders || !t->bp || !t->bl) {
        PyErr_NoMemory();
        goto bad;
    }
    for (int r = n - 1; r >= 0; r--) {
        t->hcount[t->hosts[r]]++;
        t->leaders[t->hosts[r]] = r;
    }
    for (int h = 1; h < nh; h++)
        t->hstart[h] = t->hstart[h - 1] + t->hcount[h - 1];
    int *fill = PyMem_Calloc((size_t)nh, sizeof(int));
    if (!fill) {
        PyErr_NoMemory();
        goto bad;
    }
    t->identity = 1;
    for (int r = 0; r < n; r++) {
        int h = t->hosts[r];
        t->pos[r] = t->hstart[h] + fill[h]++;
        t->order[t->pos[r]] = r;
        if (t->pos[r] != r)
            t->identity = 0;
    }
    PyMem_Free(fill);
    t->rank = rank, t->size = n, t->host = t->hosts[rank], t->lsize = t->hcount[t->host];
    t->leader = t->leaders[t->host] == rank;
    if (local != Py_None) {
        int lrank, lsize;
        nd_shm_geometry(local, &lrank, &lsize);
        if (lsize != t->lsize || lrank != t->pos[rank] - t->hstart[t->host]) {
            PyErr_Format(PyExc_ValueError, "TwoGroup: local: expected rank %d of %d (this host's), got %d of %d",
                         t->pos[rank] - t->hstart[t->host], t->lsize, lrank, lsize);
            goto bad;
        }
    } else if (t->lsize != 1) {
        PyErr_Format(PyExc_ValueError, "TwoGroup: local: expected a Group of this host's %d ranks, got None", t->lsize);
        goto bad;
    }
    t->min = min, t->gather_min = gather_min;
    t->tag = -1, t->view = 0, t->failed_local = -1;
    ND_SET(t->level, 0);
    nd_tcp_set_view(tcpg, NULL, 0); /* (every rank: what ``view`` 0 says) */
    Py_DECREF(fast);
    t->local = local == Py_None ? NULL : Py_NewRef(local);
    t->tcp = Py_NewRef(tcpg);
    t->failure = Py_NewRef(failure);
    return 0;
bad:
    Py_DECREF(fast);
    Two_free_arrays(t);
    return -1;
}

static PyMethodDef Two_methods[] = {
    {"all_reduce", (PyCFunction)Two_all_reduce, METH_VARARGS, "all_reduce(buf, dtype, redop, esize, fallback, rsag)"},
    {"reduce", (PyCFunction)Two_reduce, METH_VARARGS, "reduce(buf, dtype, redop, esize, fallback, root)"},
    {"broadcast", (PyCFunction)Two_broadcast, METH_VARARGS, "broadcast(buf, dtype, root)"},
    {"barrier", (PyCFunction)Two_barrier, METH_NOARGS, "barrier()"},
    {"all_gather", (PyCFunction)Two_all_gather, METH_VARARGS,
     "all_gather(out, inp, dtype): ``out`` one buffer of size x the input's bytes"},
    {"direct", (PyCFunction)Two_direct, METH_VARARGS,
     "direct(op, root): tag both groups with the call and widen the TCP group's view to every rank"},
    {"close", (PyCFunction)Two_close, METH_NOARGS, "let the failure hook go"},
    {NULL, NULL, 0, NULL},
};

/* (read while an op runs on another thread, for a waiting op's message: an atomic load) */
static PyObject *Two_get_level(Two *t, void *closure) { return PyLong_FromLong(ND_GET(t->level)); }

static PyGetSetDef Two_getset[] = {
    {"level", (getter)Two_get_level, NULL, "the running (or last) step's group: 0 none, 1 TCP, 2 local", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef Two_members[] = {
    {"rank", T_INT, offsetof(Two, rank), READONLY, "this rank (the group's numbering)"},
    {"size", T_INT, offsetof(Two, size), READONLY, "the group's size"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject TwoType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ndist._cnative.TwoGroup",
    .tp_basicsize = sizeof(Two),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Two_init,
    .tp_dealloc = (destructor)Two_dealloc,
    .tp_traverse = (traverseproc)Two_traverse,
    .tp_clear = (inquiry)Two_clear,
    .tp_methods = Two_methods,
    .tp_members = Two_members,
    .tp_getset = Two_getset,
    .tp_doc = "One rank's two-level group: a same-host Group and a TcpGroup run as one (see ctwo.c).",
};

int nd_two_add(PyObject *m)
{
    if (PyType_Ready(&TwoType) < 0)
        return -1;
    Py_INCREF(&TwoType);
    if (PyModule_AddObject(m, "TwoGroup", (PyObject *)&TwoType) < 0) {
        Py_DECREF(&TwoType);
        return -1;
    }
    return 0;
}
