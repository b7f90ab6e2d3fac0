/* What ndist's two native engines share (``_cnative``: the same-host engine of cnative.c and
 * the TCP engine of ctcp.c): the error kinds raised to Python, the clock, the reductions
 * with their NumPy fallback, and the buffer arguments of the list ops. Definitions in
 * common.c. */
#ifndef NDIST_NATIVE_COMMON_H
#define NDIST_NATIVE_COMMON_H

#include <Python.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

/* A field its owner writes while another thread may read it with no lock between them (the
 * flight recorder's seqlocks, crecord.h; what a waiting op's messages read of the running op,
 * ``progress``, ``waiting``, ``op_start``, ``level``): an ``_Atomic`` read or written by itself
 * with a relaxed load or store (a plain move on x86-64 and AArch64), so that the reader's access
 * is no data race (C11). The owner's other reads may stay plain (a sequentially consistent load:
 * also a plain move on x86-64). */
#define ND_GET(field) atomic_load_explicit(&(field), memory_order_relaxed)
#define ND_SET(field, v) atomic_store_explicit(&(field), (v), memory_order_relaxed)

/* error kinds raised to Python as _cnative.Error(kind, peer, cause, detail); ND_E_NAMES[kind]
 * is the kind's name there (native/_engine.py maps each to its typed error).
 * E_STALLED: this rank timed out (or a peer that did failed) waiting on a peer that itself
 * waited on ``cause`` (the root cause: a stopped rank). E_LOST (TCP engine): a peer's
 * connection ended (or failed) without its close notice. E_ABORT (TCP engine): a peer sent the
 * mesh's lost notice (it could not build or keep the group; the reason is raised to Python).
 * E_NEWS (same-host engine): its wait found the failure of the TCP group it watches
 * (``Group.watch``), recorded there (``TcpGroup.raise_news`` raises it). */
enum { E_OK = 0, E_TIMEOUT, E_DEAD, E_FAILED, E_CLOSED, E_MISMATCH, E_SELF_CLOSED, E_SIGNAL, E_PY, E_SELF_FAILED,
       E_STALLED, E_CMA, E_LOST, E_ABORT, E_NEWS };
extern const char *const ND_E_NAMES[];
#define E_NAMES ND_E_NAMES

/* op codes of a collective's signature (names live in native/_engine.py); both engines name
 * ops alike in their messages */
enum { OP_ALL_REDUCE = 1, OP_REDUCE, OP_BROADCAST, OP_ALL_GATHER, OP_GATHER, OP_SCATTER, OP_ALL_TO_ALL,
       OP_REDUCE_SCATTER, OP_BARRIER };

/* A stall notice or a timeout's root cause of at least this names global rank (value -
 * STALL_GLOBAL): a rank this process waited on in another group or point to point
 * (``Group.tell_stalled``; Python reads it as ``_cnative.STALL_GLOBAL``). Below it, a group
 * rank. */
#define STALL_GLOBAL (1 << 20)
/* A stall notice with this bit set is final: its rank raised naming that root cause. Without
 * it, a first notice: the rank's deadline passed and it waits a grace, and may post a refined
 * one (a root further down a chain of waiting ranks); a waiter counts it at its grace's end. */
#define STALL_FINAL (1 << 29)

/* element sizes must divide this (the same-host engine's alignment of blocks) */
#define ND_ALIGN 64

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

/* ------------------------------------------------------------------ the learnt spin
 * Both engines' waits spin for a while before they sleep (the same-host engine on a peer's
 * futex, cnative.c ``wait_ge``; the TCP engine in ``poll``, ctcp.c ``xchg``): ``spin_us`` at
 * first, ``*spin_now_us`` now. After a wait that slept (from ``slept_at``, a now_s() time) and
 * ended: a peer that came within SPIN_GROW_MAX_S doubles the spin, up to SPIN_CAP x spin_us
 * (the spin was just too short, and the wake-up cost more than spinning on would have: on a
 * VM a halted vCPU's, hundreds of µs, so ranks that share cores could settle into sleeping on
 * every call); a later one (a peer really late) sets it back to spin_us. No spin (spin_us 0):
 * nothing is learnt. */
#define SPIN_GROW_MAX_S 2e-3
#define SPIN_CAP 10.0

static inline void spin_learn(double *spin_now_us, double spin_us, double slept_at)
{
    if (spin_us <= 0)
        return;
    if (now_s() - slept_at < SPIN_GROW_MAX_S) {
        double s = *spin_now_us * 2;
        *spin_now_us = s < SPIN_CAP * spin_us ? s : SPIN_CAP * spin_us;
    } else
        *spin_now_us = spin_us;
}

/* ------------------------------------------------------------------ reductions */
typedef struct {
    int dtype, redop;
    Py_ssize_t esize;
    PyObject *fallback; /* fallback(dst, a, b): NumPy, for dtypes without a kernel */
} Red;

/* dst = a (op) b over count elements; GIL released (re-taken for the fallback) */
int do_reduce(Red *r, char *dst, const char *a, const char *b, size_t count, PyThreadState **save);
/* checks the element size and that a kernel or a fallback exists; a Python error on failure */
int red_init(Red *r, int dtype, int redop, Py_ssize_t esize, PyObject *fallback);
/* A reduction's arguments, (buffer, dtype, redop, esize, fallback, last) parsed by ``fmt``:
 * "OiinOp" (all_reduce: last is the reduce-scatter + all-gather flag) or "OiinOi" (reduce:
 * last is the root). On success r is set up and b holds the buffer, writable, for the caller
 * to release; -1 with a Python error otherwise. */
int red_args(PyObject *args, const char *fmt, Red *r, Py_buffer *b, int *last);

/* ------------------------------------------------------------------ errors */
/* With the GIL: the Python error set now, taken as its exception (normalized, its traceback
 * attached): a new reference, the error indicator cleared; NULL when none was set */
PyObject *nd_take_exception(void);

/* ------------------------------------------------------------------ buffer arguments */
int get_buf(PyObject *o, Py_buffer *b, int writable);

/* a list of n buffers (or None: all absent; or one buffer: n equal parts of it);
 * released on failure */
typedef struct {
    Py_buffer *views;
    char **ptr;
    Py_ssize_t *len;
    int n;
} Held;

void held_release(Held *h);
int held_get(Held *h, PyObject *seq, int n, int writable);
/* h: n absent buffers (held_get of None); take ``buf`` and cut it at ``counts`` (n element
 * counts of ``esize`` bytes, in order from its start). On failure the caller releases h. */
int held_cut(Held *h, PyObject *buf, PyObject *counts, Py_ssize_t esize, int writable);

#endif
