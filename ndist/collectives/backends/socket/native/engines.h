/* The engines as the C interface (capi.c) runs them: one op on a same-host ``_cnative.Group``
 * (cnative.c) or a ``TcpGroup`` (ctcp.c) from plain pointers, the same code their Python
 * methods run. (Not ndist_engine.h, the public header: this one is the extension's own.) */
#ifndef NDIST_NATIVE_ENGINES_H
#define NDIST_NATIVE_ENGINES_H

#include <Python.h>
#include <stdint.h>

#include "common.h"

/* One op: ``op`` an OP_* code (common.h) of all_reduce, broadcast, all_gather, all_to_all,
 * reduce_scatter or barrier. ``out`` (``outbytes``) is the buffer of all_reduce and broadcast,
 * else the output (all_gather, all_to_all: every rank's block; reduce_scatter: this rank's);
 * ``in`` (``inbytes``) the input (all_gather: this rank's block; all_to_all, reduce_scatter:
 * one block per rank). Checked by the caller: sizes, dtype, a kernel or a ``fallback``. */
typedef struct {
    int op, dtype, redop, root, rsag;
    Py_ssize_t esize;
    PyObject *fallback; /* NumPy's reduction where the engine has no kernel (borrowed), or NULL */
    char *out;
    Py_ssize_t outbytes;
    const char *in;
    Py_ssize_t inbytes;
    /* all_to_all with split sizes (the uneven single-buffer form): the elements of each rank's
     * block, ``size`` counts each; ``out`` and ``in`` are cut at them in order (block q of ``in``
     * goes to rank q, block q of ``out`` comes from rank q). NULL: ``size`` equal blocks. Checked
     * by the caller: each >= 0, summing to outbytes / inbytes over esize. */
    const Py_ssize_t *out_counts, *in_counts;
} NdOp;

/* ``o`` is a same-host Group */
int nd_shm_is(PyObject *o);
/* its rank and size */
void nd_shm_geometry(PyObject *o, int *rank, int *size);
/* Run ``op`` on Group ``o``: called with the GIL released (``*save``: the thread state, which
 * the engine restores for a moment to call back into Python), as the Group's methods do.
 * E_OK, an E_* kind (the failure is in the group: ``nd_shm_raise``), ND_SHM_BROKEN (an
 * earlier failure broke the group) or ND_SHM_NOMEM. */
#define ND_SHM_BROKEN (-1)
#define ND_SHM_NOMEM (-2)
int nd_shm_run(PyObject *o, const NdOp *op, PyThreadState **save);
/* With the GIL: set the Python exception the Group's method raises for ``rc`` (a
 * ``_cnative.Error``, the same RuntimeError for a broken group); returns NULL. */
PyObject *nd_shm_raise(PyObject *o, int rc);

/* set the sequence number the group's next op carries (the ``seq`` attribute) */
void nd_shm_set_seq(PyObject *o, unsigned long long seq);

/* The same for a TcpGroup that is no two-level group's (its view is the whole group; one with a
 * view returns ND_SHM_BROKEN). A failure leaves its sockets claimed until nd_tcp_raise. */
void nd_tcp_geometry(PyObject *o, int *rank, int *size);
int nd_tcp_run(PyObject *o, const NdOp *op, PyThreadState **save);
PyObject *nd_tcp_raise(PyObject *o, int rc);
void nd_tcp_set_seq(PyObject *o, unsigned long long seq);
/* ``o`` is a TcpGroup */
int nd_tcp_is(PyObject *o);

/* A two-level group's steps (ctwo.c), without the GIL. ``nd_shm_run`` also runs OP_REDUCE (to
 * ``root``); ``nd_shm_scatter_to``: local rank 0's ``buf`` (``nbytes``) to local rank ``to``
 * alone, into its ``buf`` (the others' ``buf`` unused). ``nd_tcp_step``: ``op`` (also
 * OP_REDUCE) among the TcpGroup's view (the leaders, or every rank; this rank in it, roots in
 * its numbering), the list ops' blocks given (``outs``/``olen``, ``ins``/``ilen``: one per rank
 * of the view) or NULL (the buffer cut in equal blocks); returns as nd_tcp_run. The tag is ORed
 * into the op code of every frame and header (the call's op and root: two calls whose steps
 * look alike are told apart); ``nd_tcp_set_view``: ``map`` (``k`` group ranks, copied) or NULL
 * (every rank), between ops; -1 when out of memory. */
int nd_shm_scatter_to(PyObject *o, int to, char *buf, Py_ssize_t nbytes, int dtype, PyThreadState **save);
/* all_gather into ``outs`` (one block per local rank, ``olen`` bytes each: uneven blocks too) */
int nd_shm_all_gather(PyObject *o, char **outs, Py_ssize_t *olen, const char *in, Py_ssize_t inbytes, int dtype,
                      PyThreadState **save);
void nd_shm_set_tag(PyObject *o, int tag);
int nd_tcp_step(PyObject *o, const NdOp *op, char **outs, Py_ssize_t *olen, char **ins, Py_ssize_t *ilen,
                PyThreadState **save);
void nd_tcp_set_tag(PyObject *o, int tag);
int nd_tcp_set_view(PyObject *o, const int *map, int k);

/* The two-level group (ctwo.c, ``_cnative.TwoGroup``; native/_twolevel.py): ``nd_two_run``
 * runs ``op`` (also OP_REDUCE) as its steps on the local Group and the TcpGroup, as nd_shm_run
 * does (E_OK, or the failing step's code: ``nd_two_raise`` raises that step's error mapped by
 * the group's ``failure`` hook, which fails the other group naming the same rank, or
 * ND_SHM_NOMEM). all_gather: one output buffer of ``size`` equal blocks (``nd_two_all_gather``:
 * blocks of ``lens[r]`` bytes, in rank order). */
int nd_two_is(PyObject *o);
void nd_two_geometry(PyObject *o, int *rank, int *size);
int nd_two_run(PyObject *o, const NdOp *op, PyThreadState **save);
int nd_two_all_gather(PyObject *o, const NdOp *op, const Py_ssize_t *lens, PyThreadState **save);
PyObject *nd_two_raise(PyObject *o, int rc);
void nd_two_set_seq(PyObject *o, unsigned long long seq);
/* add ``TwoGroup`` to module ``m`` */
int nd_two_add(PyObject *m);

/* A compiled group of any kind, as FastLane (clane.c) and the C interface (capi.c) hold it:
 * G_SHM a same-host Group, G_TCP a TcpGroup (no view), G_TWO a TwoGroup. */
enum { G_SHM = 0, G_TCP, G_TWO };

static inline void nd_group_geometry(int kind, PyObject *o, int *rank, int *size)
{
    if (kind == G_SHM)
        nd_shm_geometry(o, rank, size);
    else if (kind == G_TCP)
        nd_tcp_geometry(o, rank, size);
    else
        nd_two_geometry(o, rank, size);
}

static inline void nd_group_set_seq(int kind, PyObject *o, unsigned long long seq)
{
    if (kind == G_SHM)
        nd_shm_set_seq(o, seq);
    else if (kind == G_TCP)
        nd_tcp_set_seq(o, seq);
    else
        nd_two_set_seq(o, seq);
}

static inline int nd_group_run(int kind, PyObject *o, const NdOp *op, PyThreadState **save)
{
    return kind == G_SHM ? nd_shm_run(o, op, save) : kind == G_TCP ? nd_tcp_run(o, op, save) : nd_two_run(o, op, save);
}

static inline PyObject *nd_group_raise(int kind, PyObject *o, int rc)
{
    return kind == G_SHM ? nd_shm_raise(o, rc) : kind == G_TCP ? nd_tcp_raise(o, rc) : nd_two_raise(o, rc);
}

/* With the GIL: the exception the group's method raises for ``rc`` (nd_group_raise), as the
 * object a failure hook takes (nd_take_exception: a new reference, its traceback attached, the
 * error indicator cleared) */
static inline PyObject *nd_group_exception(int kind, PyObject *o, int rc)
{
    nd_group_raise(kind, o, rc);
    return nd_take_exception();
}

/* capi.c: add the C interface (``_C_API`` and the handle functions) to module ``m``; 0 or -1
 * with a Python error set */
int nd_capi_add(PyObject *m);
/* clane.c: add ``LaneState`` and ``FastLane`` (the repeated call in one C call) to ``m`` */
int nd_lane_add(PyObject *m);
/* ``o`` is a FastLane */
int nd_lane_is(PyObject *o);
/* A C interface call (capi.c) on FastLane ``lane``, the group's C core, with the bookkeeping
 * FastLane's own methods do (claim, number, record, the op, AVG's finish, the end), with the GIL
 * (``ts`` NULL: released around the op) or without it (``ts``: this thread's Python thread state,
 * not current; the GIL is taken only for a dtype code's first sight on the lane, for waking the
 * executor's worker when a job was queued meanwhile, and by the engine's own calls back into
 * Python, as for the groups' methods). ``dtypes``: NumPy's dtype of each dtype code (a tuple,
 * None where none: read on a first sight); ``count_in`` / ``count_out``: the record's counts.
 * ND_LANE_NOT_TAKEN: nothing done (a dtype or reduce op the core does not finish, no element, a
 * busy, closed or broken group, a queued job): the Python hooks take the call. 0: done (the op
 * ran; a failure to wake the executor's worker after it is reported, not returned: clane.c's
 * ``leave``). -1: a dtype's first sight failed (nothing ran): its Python error, set (with the
 * GIL) or fetched into ``out->err`` (without). 1: the op failed, the
 * claim still held: ``out`` says how; with the GIL, ``nd_lane_failed`` gives the failure hook's
 * arguments, and the hook ends the claim. */
#define ND_LANE_NOT_TAKEN (-2)
typedef struct {
    int rc;                 /* 1: the engine's code for the failure (for nd_group_raise) */
    uint64_t slot;          /* 1: the recorder's entry */
    unsigned long long seq; /* 1: the lane's number */
    PyObject *err[3];       /* -1 without the GIL: the error's type, value and traceback (new references) */
} NdLaneOut;
int nd_lane_call(PyObject *lane, NdOp *op, Py_ssize_t count_in, Py_ssize_t count_out, PyObject *dtypes,
                 PyThreadState *ts, NdLaneOut *out);
/* With the GIL, after nd_lane_call returned 1: ``*exc`` (the group's exception), ``*entry`` (the
 * recorder's entry or NULL) and ``*seq`` (the lane's number), new references, for the caller's
 * failure hook. */
void nd_lane_failed(PyObject *lane, const NdLaneOut *out, PyObject **exc, PyObject **entry, PyObject **seq);

#endif
