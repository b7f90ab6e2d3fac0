/* ndist's native same-host engine (module ``_cnative``): the hot path of a collective
 * between ranks of one host, end to end, in one call with the GIL released.
 *
 * Every rank owns one file in /dev/shm (made and mapped by ``_native.py``) that every
 * peer maps too:
 *
 *     0       control block (one cache line per word: post, done, bell/sleepers, state)
 *     4096    slot 0: header (64 bytes), lens table (n x u64), data (``slot`` bytes)
 *     ...     slot 1: the same
 *
 * A collective is one or more *pieces*; every rank numbers them alike (``g->piece``),
 * piece ``p`` uses slot ``p % 2``. In a piece a rank stages its contribution (a copy
 * into its slot; the header carries the call's signature), publishes ``post``, waits
 * for the peers it reads from, reads or reduces straight from their slots (the same
 * rank order on every rank: bit-identical results), then publishes ``done = p``.
 * Before staging piece ``p`` a rank waits until every peer's ``done >= p - 2``: nobody
 * still reads the slot it is about to overwrite.
 *
 * Memory ordering is C11 atomics only (release stores / acquire loads of ``post`` and
 * ``done``), so the protocol holds on weakly ordered CPUs (aarch64) as on x86-64.
 * Waiting spins for ``spin_us`` (0 when ranks outnumber cores), then sleeps on the
 * peer's ``bell`` futex. A sleep the peer ended within ``SPIN_GROW_MAX_S`` doubles this rank's
 * spin (up to ``SPIN_CAP`` x ``spin_us``): the spin was just too short, and the wake-up cost
 * more than spinning on would have (on a VM, a halted vCPU's: hundreds of µs, so ranks that
 * share cores could settle into sleeping on every call); a longer sleep (a peer that is
 * really late) sets it back to ``spin_us``; a writer bumps its bell after every store and wakes it only
 * when someone sleeps on it (seq_cst on both sides: no lost wake-up). A sleeping
 * waiter looks every 20 ms at the peer's state word (closed / failed, with the
 * root-cause rank) and its own state (closed from another thread), and every 100 ms at
 * the members' pids (dead or zombie), its deadline, pending Python signals (main thread)
 * and, in a two-level group's steps, the TCP group it watches (``watch``: a peer's FAIL
 * frame, a frame of this op sent direct; ``nd_tcp_news``).
 */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include <Python.h>
#include <pythread.h>
#include <structmember.h>

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "cma.h"
#include "kernels.h"
#include "common.h"
#include "crecord.h"
#include "ctcp.h"
#include "engines.h"

/* ------------------------------------------------------------------ layout */
#define CTL_BYTES 4096
#define HDR_BYTES 64
#define ALIGN 64
/* ranks whose reads a control block records (``cma``): larger groups copy through the slots */
#define CMA_RANKS 2048
/* a lens-table entry with this bit: the block goes by address (cma.h), not through the slot */
#define CMA_FLAG (1ULL << 63)

enum { ST_ALIVE = 0, ST_CLOSED = 1, ST_FAILED = 2 };

typedef struct {
    _Atomic uint64_t post;
    char pad0[56];
    _Atomic uint64_t done;
    char pad1[56];
    _Atomic uint32_t bell;     /* futex word: bumped after every post / done / state change */
    _Atomic uint32_t sleepers; /* processes asleep on ``bell`` */
    char pad2[56];
    _Atomic uint32_t state;
    _Atomic int32_t cause;     /* root-cause rank of a failure (-1: this rank itself; <= -2: this rank
                                * timed out waiting on rank -2 - cause) */
    int32_t pid;
    _Atomic int32_t stall_rank;  /* the timeout notice: this rank's deadline passed in piece (a group
                                  * rank, or STALL_GLOBAL + a global rank: Group.tell_stalled) */
    _Atomic uint64_t stall_piece; /* stall_piece - 1 waiting on stall_rank (0: none; cleared at the next op) */
    _Atomic uint64_t addr;       /* this control block's address in its owner's process (cma probe target) */
    _Atomic uint8_t cma[CMA_RANKS]; /* cma[q]: 1 this rank can read rank q's memory, 2 it cannot, 0 not probed */
} ctl_t;

typedef struct {
    uint64_t piece;
    int32_t op, dtype, redop, root;
    uint64_t nbytes; /* op-specific: the buffer (all_reduce, reduce, broadcast), this rank's part */
    uint64_t pieces; /* pieces this rank needs (all_to_all) or the op has (gather/scatter root) */
    uint64_t esize;
    uint64_t seq;    /* the collective's sequence number on its group (for messages) */
    uint64_t spare;  /* a single-copy broadcast's root: its buffer's address (0: the data is in the slots) */
} hdr_t;

_Static_assert(sizeof(hdr_t) == HDR_BYTES, "header is one cache line");
_Static_assert(sizeof(ctl_t) <= CTL_BYTES, "control block fits");

/* op codes, STALL_GLOBAL and STALL_FINAL: common.h. In the state's cause word a timeout's root
 * cause is -2 - cause (err_cause). */

/* error kinds raised to Python as _cnative.Error(kind, peer, cause, theirs) */
/* E_STALLED: this rank timed out (or a peer that did failed) waiting on a peer that itself waited on
 * ``cause`` (the root cause: a stopped rank) */

static PyObject *Error; /* _cnative.Error */
static unsigned long main_thread;

typedef struct {
    PyObject_HEAD
    int rank, size;
    Py_ssize_t slot;      /* data bytes per slot */
    Py_ssize_t stride;    /* bytes from one slot to the next */
    Py_ssize_t data_off;  /* data's offset in a slot */
    double timeout;
    double spin_us;
    double spin_now_us;   /* this rank's spin now: spin_us, longer after sleeps its peer ended soon (wait_ge) */
    _Atomic uint64_t piece; /* (read by another thread's message: ``progress``; common.h, ND_SET) */
    int broken;
    uint64_t op_first;    /* the current op's first piece */
    uint64_t op_pieces;   /* and how many this rank knows it has (1: a mismatch is recoverable) */
    unsigned long long seq; /* set by the caller before each op: its sequence number */
    int64_t err_sends, err_wants; /* a per-peer length mismatch: what the peer sends, what this rank expects */
    Py_buffer *maps;      /* one per rank, own included */
    char **base;
    int32_t *pids;
    /* the failure being reported */
    int err_kind, err_peer, err_cause;
    hdr_t err_theirs;
    uint64_t err_waited;  /* what was waited for (post / done value) */
    int err_word;         /* 0 post, 1 done */
    /* the stall warning: on_stall(peer, word, waited_s, left_s) once the op waited warn_after
     * seconds (0: never), then every WARN_EVERY seconds */
    PyObject *on_stall;
    double warn_after, warn_at;
    _Atomic double op_start; /* (read by another thread's message: ``op_start``; common.h, ND_SET) */
    /* the deadline passed: this rank posted its notice and waits until grace_end for a peer's */
    int in_grace;
    double grace_end;
    int told; /* the notice this rank posted in its grace (a group rank or STALL_GLOBAL + a global rank) */
    /* single-copy all_to_all: blocks of at least cma_min bytes (0: never) go by address to
     * peers that can read this rank; cma_probed once every peer was probed */
    Py_ssize_t cma_min;
    Py_ssize_t bcast_min;          /* a broadcast of at least this many bytes goes by address (0: never) */
    Py_ssize_t bcast_max;          /* ... and of at most this many (0: no bound) */
    Py_ssize_t gather_min;         /* an all_gather input of at least this many bytes goes by address (0: never) */
    int cma_probed;
    unsigned long long cma_blocks; /* blocks this rank read by address (for tests) */
    uint8_t *cma_sel;              /* the running all_to_all: cma_sel[q], its block to q goes by address */
    uint8_t *cma_from;             /* the running all_gather: cma_from[q], q's part came by address */
    uint64_t addr_piece;           /* 1 + the piece in which this op posted block addresses (0: none) */
    /* on_deadline(code): called with the GIL when this rank posts a first notice (the notice reaches the
     * process's other groups) */
    PyObject *on_deadline;
    /* the eager broadcast root: pieces eager_lo..eager_hi (0: none) it posted and returned from
     * without waiting for the receivers; their ``done`` is published once every receiver posted
     * that piece with the same call (``settle``), so a receiver's header stays put until then */
    uint64_t eager_lo, eager_hi;
    uint64_t op_base;      /* g->piece before the current op: pieces up to it are an earlier op's */
    int err_prior;         /* the failure was found settling an earlier broadcast (err_ours: its header) */
    hdr_t err_ours;
    /* ORed into the op code of every header this rank writes, and of every header it expects:
     * the two-level engine (native/_twolevel.py) names the call a step belongs to, so two
     * different calls whose steps look alike here do not pass for one (0: none) */
    int tag;
    /* the TCP group whose failures a wait here looks for (``watch``: a TcpGroup, or NULL), every
     * 100 ms (``nd_tcp_news``): a two-level group's shared-memory steps, where this rank takes no
     * part in the TCP group's traffic but its peers may have failed it */
    PyObject *watch;
} Group;

#define WARN_EVERY 60.0

static inline ctl_t *CTL(Group *g, int r) { return (ctl_t *)g->base[r]; }
static inline char *SLOT(Group *g, int r, uint64_t p) { return g->base[r] + CTL_BYTES + (p & 1) * g->stride; }
static inline hdr_t *HDR(Group *g, int r, uint64_t p) { return (hdr_t *)SLOT(g, r, p); }
static inline uint64_t *LENS(Group *g, int r, uint64_t p) { return (uint64_t *)(SLOT(g, r, p) + HDR_BYTES); }
static inline char *DATA(Group *g, int r, uint64_t p) { return SLOT(g, r, p) + g->data_off; }

static void futex_wait(_Atomic uint32_t *addr, uint32_t val, long ns)
{
    struct timespec ts = {ns / 1000000000L, ns % 1000000000L};
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *addr)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static inline void ring_bell(ctl_t *c)
{
    atomic_fetch_add(&c->bell, 1); /* seq_cst: ordered before the sleepers load */
    if (atomic_load(&c->sleepers))
        futex_wake(&c->bell);
}

static inline void publish(Group *g, _Atomic uint64_t *word, uint64_t v)
{
    atomic_store_explicit(word, v, memory_order_release);
    ring_bell(CTL(g, g->rank));
}

/* 1 when pid is gone or a zombie */
static int pid_dead(int32_t pid)
{
    if (pid <= 0)
        return 0;
    if (kill(pid, 0) == -1 && errno == ESRCH)
        return 1;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *rp = strrchr(buf, ')');
    return rp && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X');
}

/* The root cause a waited-on peer's timeout notice names (a group rank other than this one,
 * or STALL_GLOBAL + a global rank), for this rank's piece; -1 when it gave none. *final: the
 * notice is final (STALL_FINAL). */
static int stall_root(Group *g, int peer, int *final)
{
    ctl_t *c = CTL(g, peer);
    *final = 0;
    uint64_t sp = atomic_load_explicit(&c->stall_piece, memory_order_acquire);
    if (!sp || sp - 1 > g->piece)
        return -1;
    int r = atomic_load(&c->stall_rank);
    if (r >= 0 && (r & STALL_FINAL)) {
        *final = 1;
        r &= ~STALL_FINAL;
    }
    if (r >= STALL_GLOBAL) /* a global rank the peer waited on elsewhere */
        return r;
    return r >= 0 && r < g->size && r != g->rank ? r : -1;
}

/* Tell the peers (a first timeout notice): this rank's deadline passed waiting on ``code`` (a
 * group rank, or STALL_GLOBAL + a global rank); then the process's other groups (on_deadline,
 * with the GIL). */
static void post_stall(Group *g, int code, PyThreadState **save)
{
    ctl_t *me = CTL(g, g->rank);
    g->told = code;
    atomic_store(&me->stall_rank, code);
    atomic_store_explicit(&me->stall_piece, g->piece + 1, memory_order_release);
    ring_bell(me);
    if (g->on_deadline) {
        PyEval_RestoreThread(*save);
        PyObject *res = PyObject_CallFunction(g->on_deadline, "i", code);
        if (res)
            Py_DECREF(res);
        else
            PyErr_WriteUnraisable(g->on_deadline); /* a notice never fails the op */
        *save = PyEval_SaveThread();
    }
}

/* Wait until peer's word (0 post, 1 done) >= v. Runs without the GIL; *save is the
 * thread state, restored briefly to look at Python signals on the main thread. A wait that
 * went past its spin (at ``slept_at``) and ended teaches the spin (common.h ``spin_learn``). */
static int wait_ge(Group *g, int peer, int which, uint64_t v, double deadline, PyThreadState **save)
{
    ctl_t *c = CTL(g, peer);
    _Atomic uint64_t *w = which ? &c->done : &c->post;
    if (atomic_load_explicit(w, memory_order_acquire) >= v)
        return E_OK;
    ctl_t *me = CTL(g, g->rank);
    if (g->spin_us > 0) {
        /* spin, giving the core away between rounds of looks: a peer that shares this
         * core (the scheduler put both here) or is late runs, and this rank stays
         * runnable, so it is not a futex wake-up (on a VM, a halted vCPU: hundreds of µs)
         * behind when the peer posts. A yield with nothing else to run is ~1 µs. */
        double until = now_s() + g->spin_now_us * 1e-6;
        for (;;) {
            for (int i = 0; i < 64; i++) {
                if (atomic_load_explicit(w, memory_order_acquire) >= v)
                    return E_OK;
                cpu_relax();
            }
            if (now_s() > until)
                break;
            sched_yield();
        }
    } else {
        for (int i = 0; i < 8; i++) { /* a peer that is running needs no wake-up */
            sched_yield();
            if (atomic_load_explicit(w, memory_order_acquire) >= v)
                return E_OK;
        }
    }
    double next_check = 0, slept_at = g->spin_us > 0 ? now_s() : 0;
    /* the watched TCP group is asked from 100 ms into the sleep on: not on a wait's first
     * look, which the hot loops of small two-level calls make at every wait that sleeps */
    double news_at = g->watch ? now_s() + 0.1 : 0;
    for (;;) {
        atomic_fetch_add(&c->sleepers, 1);
        uint32_t b = atomic_load(&c->bell);
        if (atomic_load_explicit(w, memory_order_acquire) >= v) {
            atomic_fetch_sub(&c->sleepers, 1);
            spin_learn(&g->spin_now_us, g->spin_us, slept_at);
            return E_OK;
        }
        uint32_t st = atomic_load(&c->state);
        if (st == ST_ALIVE && atomic_load(&me->state) == ST_ALIVE)
            futex_wait(&c->bell, b, 20 * 1000 * 1000L);
        atomic_fetch_sub(&c->sleepers, 1);
        if (atomic_load_explicit(w, memory_order_acquire) >= v) {
            if (g->in_grace) /* the peer came after all: withdraw this rank's notice */
                atomic_store(&me->stall_piece, 0);
            spin_learn(&g->spin_now_us, g->spin_us, slept_at);
            return E_OK;
        }
        g->err_peer = peer;
        g->err_waited = v;
        g->err_word = which;
        st = atomic_load(&c->state);
        if (st == ST_FAILED) {
            g->err_cause = atomic_load(&c->cause);
            if (g->err_cause <= -2 && -2 - g->err_cause != g->rank) { /* it timed out waiting on that rank */
                g->err_cause = -2 - g->err_cause;
                return E_STALLED;
            }
            if (g->err_cause <= -2)
                g->err_cause = -1; /* it timed out waiting on this rank: it failed */
            return E_FAILED;
        }
        if (st == ST_CLOSED)
            return E_CLOSED;
        st = atomic_load(&me->state);
        if (st == ST_FAILED) { /* Group.fail: the backend learnt of a loss elsewhere */
            g->err_cause = atomic_load(&me->cause);
            return E_SELF_FAILED;
        }
        if (st != ST_ALIVE)
            return E_SELF_CLOSED;
        /* any member that failed before finishing this piece: the group cannot finish this op */
        for (int q = 0; q < g->size; q++) {
            if (q == g->rank || q == peer || atomic_load(&CTL(g, q)->state) != ST_FAILED ||
                atomic_load_explicit(&CTL(g, q)->done, memory_order_acquire) >= g->piece)
                continue;
            g->err_peer = q;
            g->err_cause = atomic_load(&CTL(g, q)->cause);
            if (g->err_cause <= -2 && -2 - g->err_cause != g->rank) {
                g->err_cause = -2 - g->err_cause;
                return E_STALLED;
            }
            if (g->err_cause <= -2)
                g->err_cause = -1;
            return E_FAILED;
        }
        double t = now_s();
        if (g->in_grace) { /* a notice from the peer waited on: it names the root cause */
            int fin, r = stall_root(g, peer, &fin);
            if (r >= 0 && fin) {
                g->err_cause = r;
                return E_STALLED;
            }
            if (r >= 0 && r != g->told) /* a first one: refine this rank's own; it counts at grace_end */
                post_stall(g, r, save);
        }
        if (t >= next_check) {
            next_check = t + 0.1;
            if (pid_dead(g->pids[peer]))
                return E_DEAD;
            if (g->watch && t >= news_at) { /* its peers failed it, or run this call direct */
                hdr_t *h = HDR(g, g->rank, g->piece);
                NdCall call = {0, 0, 0, -1, 0, 0};
                if (h->seq == g->seq) /* (this op's header: it names the call) */
                    call = (NdCall){h->op, h->dtype, h->redop, h->root, h->nbytes, h->esize};
                if (nd_tcp_news(g->watch, &call))
                    return E_NEWS;
            }
            /* any member that died before finishing this piece (not one that closed first, nor
             * one whose part of this piece is all posted and read): seen here, not only by
             * the ranks that wait on it */
            for (int q = 0; q < g->size; q++) {
                ctl_t *cq = CTL(g, q);
                if (q != g->rank && q != peer && atomic_load(&cq->state) == ST_ALIVE &&
                    atomic_load_explicit(&cq->done, memory_order_acquire) < g->piece && pid_dead(g->pids[q])) {
                    g->err_peer = q;
                    return E_DEAD;
                }
            }
            if (t > deadline) {
                int fin, r = stall_root(g, peer, &fin);
                if (r >= 0 && fin) { /* the peer raised first: it waited on r */
                    g->err_cause = r;
                    return E_STALLED;
                }
                if (!g->in_grace) { /* tell the peers (the root known so far), then give notices a grace */
                    g->in_grace = 1;
                    double grace = g->timeout * 0.1 < 1.0 ? g->timeout * 0.1 : 1.0;
                    g->grace_end = t + grace;
                    post_stall(g, r >= 0 ? r : peer, save);
                }
                if (t > g->grace_end) {
                    if (r >= 0) { /* the peer's first notice: it waits on r */
                        g->err_cause = r;
                        return E_STALLED;
                    }
                    return E_TIMEOUT;
                }
            }
            int on_main = PyThread_get_thread_ident() == main_thread;
            int warn = t >= g->warn_at && g->on_stall;
            if (on_main || warn) {
                PyEval_RestoreThread(*save);
                int bad = on_main ? PyErr_CheckSignals() : 0;
                if (!bad && warn) {
                    g->warn_at = t + WARN_EVERY;
                    PyObject *res = PyObject_CallFunction(g->on_stall, "iidd", peer, which, t - g->op_start,
                                                          deadline - t);
                    if (res)
                        Py_DECREF(res);
                    else
                        PyErr_WriteUnraisable(g->on_stall); /* a warning never fails the op */
                }
                *save = PyEval_SaveThread();
                if (bad)
                    return E_SIGNAL;
            }
        }
    }
}

/* dst = src[0] (op) src[1] (op) ... in rank order */
static int fold(Group *g, Red *r, char *dst, Py_ssize_t peer_off, uint64_t p, size_t count, PyThreadState **save)
{
    int n = g->size, rc;
    if (n == 1) {
        memmove(dst, DATA(g, 0, p) + peer_off, count * r->esize);
        return E_OK;
    }
    rc = do_reduce(r, dst, DATA(g, 0, p) + peer_off, DATA(g, 1, p) + peer_off, count, save);
    for (int q = 2; q < n && rc == E_OK; q++)
        rc = do_reduce(r, dst, dst, DATA(g, q, p) + peer_off, count, save);
    return rc;
}

/* ------------------------------------------------------------------ pieces */
typedef struct {
    int op, dtype, redop, root;
    uint64_t nbytes, pieces, esize;
} Sig;

static int check_hdr(Group *g, int q, uint64_t p, const Sig *s, int cmp_nbytes, uint64_t want_nbytes);

/* The eager root's pieces up to ``upto`` (eager_lo..): wait until every receiver posted the
 * piece (any post of it: headers go first), check its header against this rank's own (still
 * in its slot: it is rewritten only at piece + 2, after this), then publish ``done``. A
 * failure in a piece of an earlier op (the broadcast the caller returned from) is marked
 * ``err_prior``: the op raising it is not the one that failed. */
static int settle(Group *g, uint64_t upto, double deadline, PyThreadState **save)
{
    int me = g->rank;
    while (g->eager_lo && g->eager_lo <= upto) {
        uint64_t e = g->eager_lo;
        hdr_t *mine = HDR(g, me, e);
        Sig s = {mine->op, mine->dtype, mine->redop, mine->root, mine->nbytes, mine->pieces, mine->esize};
        for (int q = 0; q < g->size; q++) {
            if (q == me)
                continue;
            int rc = wait_ge(g, q, 0, 2 * e, deadline, save);
            if (!rc)
                rc = check_hdr(g, q, e, &s, 1, mine->nbytes);
            if (rc) {
                if (e <= g->op_base) {
                    g->err_prior = 1;
                    memcpy(&g->err_ours, mine, sizeof(hdr_t));
                }
                return rc;
            }
        }
        publish(g, &CTL(g, me)->done, e);
        g->eager_lo = e < g->eager_hi ? e + 1 : 0;
    }
    return E_OK;
}

static int begin_piece(Group *g, double deadline, PyThreadState **save, uint64_t *pp)
{
    if (g->eager_lo) {
        /* an op's first piece settles every earlier broadcast (its mismatch or a dead receiver
         * is raised here, by the root's next op); later pieces only what their slot reuses */
        int rc = settle(g, g->op_first ? g->piece - 1 : g->piece, deadline, save);
        if (rc)
            return rc;
    }
    uint64_t p = ND_GET(g->piece) + 1;
    ND_SET(g->piece, p);
    if (!g->op_first)
        g->op_first = p;
    if (p > 2) {
        for (int q = 0; q < g->size; q++) {
            if (q == g->rank)
                continue;
            int rc = wait_ge(g, q, 1, p - 2, deadline, save);
            if (rc)
                return rc;
        }
    }
    *pp = p;
    return E_OK;
}

static inline void write_hdr(Group *g, uint64_t p, const Sig *s)
{
    hdr_t *h = HDR(g, g->rank, p);
    h->piece = p;
    h->op = s->op;
    h->dtype = s->dtype;
    h->redop = s->redop;
    h->root = s->root;
    h->nbytes = s->nbytes;
    h->pieces = s->pieces;
    h->esize = s->esize;
    h->seq = g->seq;
    h->spare = 0;
}

/* after waiting for q's post of piece p: the same call? (nbytes compared when cmp_nbytes) */
static int check_hdr(Group *g, int q, uint64_t p, const Sig *s, int cmp_nbytes, uint64_t want_nbytes)
{
    hdr_t *h = HDR(g, q, p);
    if (h->piece != p || h->op != s->op || h->dtype != s->dtype || h->redop != s->redop || h->root != s->root ||
        (cmp_nbytes && h->nbytes != want_nbytes)) {
        g->err_peer = q;
        memcpy(&g->err_theirs, h, sizeof(hdr_t));
        return E_MISMATCH;
    }
    return E_OK;
}

static int wait_check(Group *g, int q, uint64_t v, uint64_t p, const Sig *s, int cmp, uint64_t want, double deadline,
                      PyThreadState **save)
{
    int rc = wait_ge(g, q, 0, v, deadline, save);
    return rc ? rc : check_hdr(g, q, p, s, cmp, want);
}

static inline Py_ssize_t min_ss(Py_ssize_t a, Py_ssize_t b) { return a < b ? a : b; }
static inline Py_ssize_t pieces_of(Py_ssize_t nbytes, Py_ssize_t per) { return nbytes <= 0 ? 1 : (nbytes + per - 1) / per; }

/* Read peer q's part, ``len`` bytes at ``addr`` in its process, into ``dst`` (a part it sent
 * by address: all_to_all blocks, all_gather parts, a broadcast). 0, or q gone (E_DEAD) or
 * the read refused (E_CMA). */
static int read_by_addr(Group *g, int q, char *dst, uint64_t addr, size_t len)
{
    int err = cma_read(g->pids[q], dst, addr, len);
    if (err) {
        g->err_peer = q;
        return pid_dead(g->pids[q]) ? E_DEAD : E_CMA;
    }
    g->cma_blocks++;
    return E_OK;
}

/* Wait until every reader of this rank's posted addresses (``cma_sel``) is done with piece
 * ``p0``; then the caller's buffers are its own again (``addr_piece`` cleared). */
static int await_readers(Group *g, uint64_t p0, double deadline, PyThreadState **save)
{
    for (int q = 0; q < g->size; q++) {
        int rc;
        if (g->cma_sel[q] && (rc = wait_ge(g, q, 1, p0, deadline, save)))
            return rc;
    }
    g->addr_piece = 0;
    return E_OK;
}

/* per-destination quota of a slot for the list ops */
static inline Py_ssize_t quota(Group *g) { Py_ssize_t q = g->slot / g->size / ALIGN * ALIGN; return q < ALIGN ? ALIGN : q; }

/* ------------------------------------------------------------------ the ops */
static int run_all_reduce(Group *g, char *buf, Py_ssize_t nbytes, Red *r, int rsag, double dl, PyThreadState **sv)
{
    int n = g->size, me = g->rank, rc;
    Py_ssize_t per = g->slot / r->esize * r->esize;
    Py_ssize_t M = pieces_of(nbytes, per);
    Sig s = {OP_ALL_REDUCE | g->tag, r->dtype, r->redop, -1, (uint64_t)nbytes, (uint64_t)M, (uint64_t)r->esize};
    g->op_pieces = s.pieces;
    for (Py_ssize_t j = 0; j < M; j++) {
        Py_ssize_t off = j * per, len = min_ss(per, nbytes - off);
        size_t cnt = (size_t)(len / r->esize);
        uint64_t p;
        if ((rc = begin_piece(g, dl, sv, &p)))
            return rc;
        write_hdr(g, p, &s);
        memcpy(DATA(g, me, p), buf + off, len);
        if (!rsag) {
            publish(g, &CTL(g, me)->post, 2 * p + 1);
            for (int q = 0; q < n; q++)
                if (q != me && (rc = wait_check(g, q, 2 * p + 1, p, &s, 1, (uint64_t)nbytes, dl, sv)))
                    return rc;
            if ((rc = fold(g, r, buf + off, 0, p, cnt, sv)))
                return rc;
        } else {
            /* reduce-scatter + all-gather through the slots: rank me reduces block me */
            publish(g, &CTL(g, me)->post, 2 * p);
            for (int q = 0; q < n; q++)
                if (q != me && (rc = wait_check(g, q, 2 * p, p, &s, 1, (uint64_t)nbytes, dl, sv)))
                    return rc;
            size_t b0 = cnt * me / n, b1 = cnt * (me + 1) / n;
            Py_ssize_t o0 = (Py_ssize_t)b0 * r->esize, ob = (Py_ssize_t)(b1 - b0) * r->esize;
            if ((rc = fold(g, r, buf + off + o0, o0, p, b1 - b0, sv)))
                return rc;
            memcpy(DATA(g, me, p) + o0, buf + off + o0, ob); /* only this rank reads block me */
            publish(g, &CTL(g, me)->post, 2 * p + 1);
            for (int q = 0; q < n; q++) {
                if (q == me)
                    continue;
                if ((rc = wait_ge(g, q, 0, 2 * p + 1, dl, sv)))
                    return rc;
                size_t c0 = cnt * q / n, c1 = cnt * (q + 1) / n;
                memcpy(buf + off + c0 * r->esize, DATA(g, q, p) + c0 * r->esize, (c1 - c0) * r->esize);
            }
        }
        publish(g, &CTL(g, me)->done, p);
    }
    return E_OK;
}

static int run_reduce(Group *g, char *buf, Py_ssize_t nbytes, Red *r, int root, double dl, PyThreadState **sv)
{
    int n = g->size, me = g->rank, rc;
    Py_ssize_t per = g->slot / r->esize * r->esize;
    Py_ssize_t M = pieces_of(nbytes, per);
    Sig s = {OP_REDUCE | g->tag, r->dtype, r->redop, root, (uint64_t)nbytes, (uint64_t)M, (uint64_t)r->esize};
    g->op_pieces = s.pieces;
    for (Py_ssize_t j = 0; j < M; j++) {
        Py_ssize_t off = j * per, len = min_ss(per, nbytes - off);
        uint64_t p;
        if ((rc = begin_piece(g, dl, sv, &p)))
            return rc;
        write_hdr(g, p, &s);
        memcpy(DATA(g, me, p), buf + off, len);
        publish(g, &CTL(g, me)->post, 2 * p + 1);
        if (me == root) {
            for (int q = 0; q < n; q++)
                if (q != me && (rc = wait_check(g, q, 2 * p + 1, p, &s, 1, (uint64_t)nbytes, dl, sv)))
                    return rc;
            if ((rc = fold(g, r, buf + off, 0, p, (size_t)(len / r->esize), sv)))
                return rc;
        } else if ((rc = wait_check(g, root, 2 * p + 1, p, &s, 1, (uint64_t)nbytes, dl, sv))) {
            return rc; /* the root's call: the same op? (the Python engine's ticket) */
        }
        publish(g, &CTL(g, me)->done, p);
    }
    return E_OK;
}

static inline int cma_to(Group *g, int q, Py_ssize_t len);

/* Single copy: a root whose every receiver can read its memory sends a buffer of
 * ``bcast_min`` to ``bcast_max`` bytes by address (its header's ``spare``) in one piece; each receiver reads it
 * whole (``process_vm_readv``) and the root returns once every receiver is done with that
 * piece (its buffer must stay put until then: not eager). */
static int bcast_by_addr(Group *g, char *buf, Py_ssize_t nbytes, Sig *s, double dl, PyThreadState **sv)
{
    int me = g->rank, rc;
    uint64_t p;
    s->pieces = 1;
    g->op_pieces = 1;
    if ((rc = begin_piece(g, dl, sv, &p)))
        return rc;
    write_hdr(g, p, s);
    HDR(g, me, p)->spare = (uint64_t)(uintptr_t)buf;
    for (int q = 0; q < g->size; q++)
        g->cma_sel[q] = q != me;
    publish(g, &CTL(g, me)->post, 2 * p + 1);
    g->addr_piece = p + 1; /* from here the receivers may read this rank's buffer */
    for (int q = 0; q < g->size; q++)
        if (q != me && (rc = wait_check(g, q, 2 * p + 1, p, s, 1, (uint64_t)nbytes, dl, sv)))
            return rc;
    if ((rc = await_readers(g, p, dl, sv)))
        return rc;
    publish(g, &CTL(g, me)->done, p);
    return E_OK;
}

static int run_broadcast(Group *g, char *buf, Py_ssize_t nbytes, int dtype, int root, double dl, PyThreadState **sv)
{
    int me = g->rank, rc;
    Py_ssize_t per = g->slot;
    Py_ssize_t M = pieces_of(nbytes, per);
    Sig s = {OP_BROADCAST | g->tag, dtype, 0, root, (uint64_t)nbytes, (uint64_t)M, 0};
    g->op_pieces = s.pieces;
    if (me == root && g->bcast_min > 0 && nbytes >= g->bcast_min && (!g->bcast_max || nbytes <= g->bcast_max)) {
        int all = 1;
        for (int q = 0; q < g->size && all; q++)
            all = q == me || cma_to(g, q, nbytes);
        if (all)
            return bcast_by_addr(g, buf, nbytes, &s, dl, sv);
    }
    for (Py_ssize_t j = 0; j < M; j++) {
        Py_ssize_t off = j * per, len = min_ss(per, nbytes - off);
        uint64_t p;
        if ((rc = begin_piece(g, dl, sv, &p)))
            return rc;
        write_hdr(g, p, &s);
        if (me == root)
            memcpy(DATA(g, me, p), buf + off, len);
        publish(g, &CTL(g, me)->post, 2 * p + 1);
        if (me == root) {
            /* eager: the data is in the slot, the caller's buffer is free; every receiver's
             * call (the same op? alive?) is checked by ``settle``, at the latest at this
             * rank's next op (the Python engine's tickets, later) */
            if (!g->eager_lo)
                g->eager_lo = p;
            g->eager_hi = p;
            continue;
        }
        if ((rc = wait_check(g, root, 2 * p + 1, p, &s, 1, (uint64_t)nbytes, dl, sv)))
            return rc;
        uint64_t a = HDR(g, root, p)->spare;
        if (j == 0 && a) { /* the root sent it by address (bcast_by_addr): one piece, one read */
            g->op_pieces = 1;
            if ((rc = read_by_addr(g, root, buf, a, (size_t)nbytes)))
                return rc;
            publish(g, &CTL(g, me)->done, p);
            return E_OK;
        }
        memcpy(buf + off, DATA(g, root, p), len);
        publish(g, &CTL(g, me)->done, p);
    }
    return E_OK;
}

static void cma_probe_peers(Group *g);

static int run_barrier(Group *g, double dl, PyThreadState **sv)
{
    int me = g->rank, rc;
    Sig s = {OP_BARRIER | g->tag, 0, 0, -1, 0, 1, 0};
    g->op_pieces = s.pieces;
    uint64_t p;
    if ((rc = begin_piece(g, dl, sv, &p)))
        return rc;
    write_hdr(g, p, &s);
    publish(g, &CTL(g, me)->post, 2 * p + 1);
    for (int q = 0; q < g->size; q++)
        if (q != me && (rc = wait_check(g, q, 2 * p + 1, p, &s, 0, 0, dl, sv)))
            return rc;
    if (g->cma_min > 0)
        cma_probe_peers(g); /* every peer posted: past its Group_init (the set-up barrier probes) */
    publish(g, &CTL(g, me)->done, p);
    return E_OK;
}

/* buffers of a list op: bufs[q] (NULL/0 where absent) */
typedef struct {
    char **ptr;
    Py_ssize_t *len;
} List;

/* Single copy: a rank whose every peer can read its memory, with an input of at least
 * ``gather_min`` bytes, posts the input's address (its header's ``spare``) instead of staging it;
 * each peer reads it whole at the op's first piece and the rank returns once every peer is
 * done with that piece. Ranks that stage count the pieces (the most any rank needs). */
static int run_all_gather(Group *g, List *outs, char *inp, Py_ssize_t inlen, int dtype, double dl,
                          PyThreadState **sv)
{
    int n = g->size, me = g->rank, rc, by_addr = g->gather_min > 0 && inlen >= g->gather_min;
    Py_ssize_t per = g->slot, mx = 0;
    if (by_addr)
        cma_probe_peers(g);
    for (int q = 0; q < n; q++) {
        if (q != me && by_addr)
            by_addr = cma_to(g, q, inlen);
        if (outs->len[q] > mx && !(q != me && g->gather_min > 0 && outs->len[q] >= g->gather_min))
            mx = outs->len[q]; /* (a large part may come by address: its sender counts its pieces) */
    }
    if (!by_addr && inlen > mx)
        mx = inlen;
    Sig s = {OP_ALL_GATHER | g->tag, dtype, 0, -1, (uint64_t)inlen, (uint64_t)pieces_of(by_addr ? 0 : mx, per), 0};
    g->op_pieces = s.pieces;
    uint64_t M = s.pieces, p0 = 0;
    for (uint64_t j = 0; j < M; j++) {
        Py_ssize_t off = (Py_ssize_t)j * per;
        uint64_t p;
        if ((rc = begin_piece(g, dl, sv, &p)))
            return rc;
        write_hdr(g, p, &s);
        if (j == 0) {
            p0 = p;
            if (by_addr)
                HDR(g, me, p)->spare = (uint64_t)(uintptr_t)inp;
            for (int q = 0; q < n; q++)
                g->cma_sel[q] = by_addr && q != me;
        }
        if (!by_addr && inlen > off)
            memcpy(DATA(g, me, p), inp + off, min_ss(per, inlen - off));
        publish(g, &CTL(g, me)->post, 2 * p + 1);
        if (j == 0 && by_addr)
            g->addr_piece = p + 1; /* from here peers may read this rank's input */
        if (j == 0 && outs->ptr[me] != inp)
            memmove(outs->ptr[me], inp, min_ss(inlen, outs->len[me]));
        for (int q = 0; q < n; q++) {
            if (q == me)
                continue;
            if ((rc = wait_ge(g, q, 0, 2 * p + 1, dl, sv)))
                return rc;
            hdr_t *h = HDR(g, q, p);
            if (h->piece != p || h->op != s.op || h->dtype != s.dtype || h->nbytes != (uint64_t)outs->len[q]) {
                g->err_peer = q;
                memcpy(&g->err_theirs, h, sizeof(hdr_t));
                return E_MISMATCH;
            }
            if (j == 0) {
                if (h->pieces > M)
                    M = h->pieces;
                g->cma_from[q] = h->spare != 0;
                if (h->spare && (rc = read_by_addr(g, q, outs->ptr[q], h->spare, (size_t)outs->len[q])))
                    return rc;
            }
            if (!g->cma_from[q] && outs->len[q] > off)
                memcpy(outs->ptr[q] + off, DATA(g, q, p), min_ss(per, outs->len[q] - off));
        }
        publish(g, &CTL(g, me)->done, p);
    }
    return by_addr ? await_readers(g, p0, dl, sv) : E_OK; /* the peers have read this rank's input */
}

/* the list ops with one block per destination: all_to_all, reduce_scatter, scatter */
static int stage_blocks(Group *g, uint64_t p, List *ins, Py_ssize_t off, Py_ssize_t Q, int skip_self)
{
    uint64_t *lens = LENS(g, g->rank, p);
    char *d = DATA(g, g->rank, p);
    for (int q = 0; q < g->size; q++) {
        lens[q] = (uint64_t)ins->len[q];
        if ((skip_self && q == g->rank) || ins->len[q] <= off)
            continue;
        memcpy(d + q * Q, ins->ptr[q] + off, min_ss(Q, ins->len[q] - off));
    }
    return E_OK;
}

/* q's block for this rank is ``got`` bytes, this rank expects ``want`` */
static int len_differs(Group *g, int q, uint64_t p, uint64_t got, uint64_t want)
{
    if (got != want) {
        g->err_peer = q;
        memcpy(&g->err_theirs, HDR(g, q, p), sizeof(hdr_t));
        g->err_sends = (int64_t)got;
        g->err_wants = (int64_t)want;
        return E_MISMATCH;
    }
    return E_OK;
}

static int lens_mismatch(Group *g, int q, uint64_t p, uint64_t want)
{
    return len_differs(g, q, p, LENS(g, q, p)[g->rank], want);
}

/* Probe every peer not probed yet (their control blocks' ``addr`` set: past Group_init)
 * and publish in this rank's ``cma`` what it can read. Peers read it with acquire. */
static void cma_probe_peers(Group *g)
{
    if (g->cma_probed || g->rank >= CMA_RANKS)
        return;
    ctl_t *mine = CTL(g, g->rank);
    int all = 1;
    for (int q = 0; q < g->size && q < CMA_RANKS; q++) {
        if (q == g->rank || atomic_load_explicit(&mine->cma[q], memory_order_relaxed))
            continue;
        uint64_t a = atomic_load_explicit(&CTL(g, q)->addr, memory_order_acquire);
        if (!a) {
            all = 0;
            continue;
        }
        int ok = cma_probe(g->pids[q], a + offsetof(ctl_t, addr), a);
        atomic_store_explicit(&mine->cma[q], ok ? 1 : 2, memory_order_release);
    }
    g->cma_probed = all;
}

/* Does block ``len`` to ``q`` go by address? (q said it can read this rank) */
static inline int cma_to(Group *g, int q, Py_ssize_t len)
{
    return g->cma_min > 0 && len >= g->cma_min && q < CMA_RANKS && g->rank < CMA_RANKS &&
           atomic_load_explicit(&CTL(g, q)->cma[g->rank], memory_order_acquire) == 1;
}

/* Single copy: a block of at least ``cma_min`` bytes to a peer that can read this rank's
 * memory is not staged: its lens entry carries CMA_FLAG, its first 8 bytes in the slot the
 * block's address, and the receiver reads it whole at the op's first piece
 * (``process_vm_readv``); the sender returns only once every such receiver is done with
 * that piece (its buffer must stay put until then). */
static int run_all_to_all(Group *g, List *outs, List *ins, int dtype, double dl, PyThreadState **sv)
{
    int n = g->size, me = g->rank, rc, by_addr = 0;
    Py_ssize_t Q = quota(g), mx = 0;
    if (g->cma_min > 0)
        cma_probe_peers(g);
    for (int q = 0; q < n; q++) {
        g->cma_sel[q] = q != me && cma_to(g, q, ins->len[q]); /* decided once per op */
        if (q == me)
            continue;
        if (g->cma_sel[q])
            by_addr = 1; /* not staged: no pieces for it */
        else if (ins->len[q] > mx)
            mx = ins->len[q];
        if (outs->len[q] > mx && !(g->cma_min > 0 && outs->len[q] >= g->cma_min))
            mx = outs->len[q]; /* (a staged block's pieces are its sender's to count) */
    }
    uint64_t total = 0;
    for (int q = 0; q < n; q++)
        total += (uint64_t)ins->len[q];
    Sig s = {OP_ALL_TO_ALL | g->tag, dtype, 0, -1, total, (uint64_t)pieces_of(mx, Q), 0};
    g->op_pieces = s.pieces;
    uint64_t M = 1, p0 = 0;
    for (uint64_t j = 0; j < M; j++) {
        Py_ssize_t off = (Py_ssize_t)j * Q;
        uint64_t p;
        if ((rc = begin_piece(g, dl, sv, &p)))
            return rc;
        if (j == 0)
            p0 = p;
        write_hdr(g, p, &s);
        if (by_addr) {
            uint64_t *lens = LENS(g, me, p);
            char *d = DATA(g, me, p);
            for (int q = 0; q < n; q++) {
                lens[q] = (uint64_t)ins->len[q];
                if (q == me || ins->len[q] <= off)
                    continue;
                if (g->cma_sel[q]) {
                    lens[q] |= CMA_FLAG;
                    uint64_t a = (uint64_t)(uintptr_t)ins->ptr[q];
                    memcpy(d + q * Q, &a, sizeof a);
                } else {
                    memcpy(d + q * Q, ins->ptr[q] + off, min_ss(Q, ins->len[q] - off));
                }
            }
        } else {
            stage_blocks(g, p, ins, off, Q, 1);
        }
        publish(g, &CTL(g, me)->post, 2 * p + 1);
        if (j == 0 && by_addr)
            g->addr_piece = p + 1; /* from here peers may read this rank's buffers */
        if (j == 0 && outs->ptr[me] != ins->ptr[me])
            memmove(outs->ptr[me], ins->ptr[me], min_ss(ins->len[me], outs->len[me]));
        for (int q = 0; q < n; q++) {
            if (q == me)
                continue;
            if ((rc = wait_check(g, q, 2 * p + 1, p, &s, 0, 0, dl, sv)))
                return rc;
            uint64_t len = LENS(g, q, p)[me];
            int addr = (len & CMA_FLAG) != 0;
            if (j == 0) {
                if ((rc = len_differs(g, q, p, len & ~CMA_FLAG, (uint64_t)outs->len[q])))
                    return rc;
                if (HDR(g, q, p)->pieces > M)
                    M = HDR(g, q, p)->pieces;
                if (addr) {
                    uint64_t a;
                    memcpy(&a, DATA(g, q, p) + me * Q, sizeof a);
                    if ((rc = read_by_addr(g, q, outs->ptr[q], a, (size_t)outs->len[q])))
                        return rc;
                }
            }
            if (!addr && outs->len[q] > off)
                memcpy(outs->ptr[q] + off, DATA(g, q, p) + me * Q, min_ss(Q, outs->len[q] - off));
        }
        if (j == 0 && s.pieces > M)
            M = s.pieces;
        publish(g, &CTL(g, me)->done, p);
    }
    return by_addr ? await_readers(g, p0, dl, sv) : E_OK; /* the receivers have read this rank's buffers */
}

/* The op failed after this rank posted block addresses (``addr_piece``): a peer may be
 * reading them now, and the caller reuses its buffers once the call raised. Wait, at most
 * 1 s, until each such reader is done with the piece, or failed, closed or gone. (Called
 * after this rank's state turned failed, so a reader waiting on this rank wakes and fails
 * instead of reading.) Runs without the GIL. */
static void cma_wait_readers(Group *g)
{
    uint64_t p0 = g->addr_piece - 1;
    double until = now_s() + 1.0, look = 0;
    for (int q = 0; q < g->size; q++) {
        ctl_t *c = CTL(g, q);
        while (g->cma_sel[q] && atomic_load_explicit(&c->done, memory_order_acquire) < p0 &&
               atomic_load(&c->state) == ST_ALIVE) {
            double t = now_s();
            if (t > until)
                return;
            if (t > look) {
                look = t + 0.01;
                if (pid_dead(g->pids[q]))
                    break;
            }
            struct timespec ts = {0, 100 * 1000};
            nanosleep(&ts, NULL);
        }
    }
}

static int run_reduce_scatter(Group *g, char *out, Py_ssize_t outlen, List *ins, Red *r, double dl,
                              PyThreadState **sv)
{
    int n = g->size, me = g->rank, rc;
    Py_ssize_t Q = quota(g) / r->esize * r->esize, mx = 0;
    if (Q < r->esize)
        Q = r->esize;
    for (int q = 0; q < n; q++)
        if (ins->len[q] > mx)
            mx = ins->len[q];
    Py_ssize_t M = pieces_of(mx, Q);
    Sig s = {OP_REDUCE_SCATTER | g->tag, r->dtype, r->redop, -1, (uint64_t)outlen, (uint64_t)M, (uint64_t)r->esize};
    g->op_pieces = s.pieces;
    for (Py_ssize_t j = 0; j < M; j++) {
        Py_ssize_t off = j * Q;
        uint64_t p;
        if ((rc = begin_piece(g, dl, sv, &p)))
            return rc;
        write_hdr(g, p, &s);
        stage_blocks(g, p, ins, off, Q, 0);
        publish(g, &CTL(g, me)->post, 2 * p + 1);
        for (int q = 0; q < n; q++) {
            if (q == me)
                continue;
            if ((rc = wait_check(g, q, 2 * p + 1, p, &s, 0, 0, dl, sv)))
                return rc;
            if (j == 0 && (rc = lens_mismatch(g, q, p, (uint64_t)outlen)))
                return rc;
        }
        if (outlen > off) {
            Py_ssize_t len = min_ss(Q, outlen - off);
            if ((rc = fold(g, r, out + off, me * Q, p, (size_t)(len / r->esize), sv)))
                return rc;
        }
        publish(g, &CTL(g, me)->done, p);
    }
    return E_OK;
}

static int run_scatter(Group *g, char *out, Py_ssize_t outlen, List *ins, int dtype, int root, double dl,
                       PyThreadState **sv)
{
    int n = g->size, me = g->rank, rc;
    Py_ssize_t Q = quota(g), mx = 0;
    if (me == root)
        for (int q = 0; q < n; q++)
            if (q != me && ins->len[q] > mx)
                mx = ins->len[q];
    /* nbytes: this rank's output (the root checks it against what it sends each rank) */
    Sig s = {OP_SCATTER | g->tag, dtype, 0, root, (uint64_t)outlen, (uint64_t)pieces_of(mx, Q), 0};
    g->op_pieces = s.pieces;
    uint64_t M = me == root ? s.pieces : 1;
    for (uint64_t j = 0; j < M; j++) {
        Py_ssize_t off = (Py_ssize_t)j * Q;
        uint64_t p;
        if ((rc = begin_piece(g, dl, sv, &p)))
            return rc;
        write_hdr(g, p, &s);
        if (me == root)
            stage_blocks(g, p, ins, off, Q, 1);
        publish(g, &CTL(g, me)->post, 2 * p + 1);
        if (me == root) {
            if (j == 0 && out != ins->ptr[me])
                memmove(out, ins->ptr[me], min_ss(outlen, ins->len[me]));
            for (int q = 0; q < n; q++)
                if (q != me && (rc = wait_check(g, q, 2 * p + 1, p, &s, 1, (uint64_t)ins->len[q], dl, sv)))
                    return rc;
        } else {
            if ((rc = wait_ge(g, root, 0, 2 * p + 1, dl, sv)))
                return rc;
            hdr_t *h = HDR(g, root, p);
            if (h->piece != p || h->op != s.op || h->dtype != s.dtype || h->root != root) {
                g->err_peer = root;
                memcpy(&g->err_theirs, h, sizeof(hdr_t));
                return E_MISMATCH;
            }
            if (j == 0) {
                if ((rc = lens_mismatch(g, root, p, (uint64_t)outlen)))
                    return rc;
                M = h->pieces;
            }
            if (outlen > off)
                memcpy(out + off, DATA(g, root, p) + me * Q, min_ss(Q, outlen - off));
        }
        publish(g, &CTL(g, me)->done, p);
    }
    return E_OK;
}

static int run_gather(Group *g, List *outs, char *inp, Py_ssize_t inlen, int dtype, int root, double dl,
                      PyThreadState **sv)
{
    int n = g->size, me = g->rank, rc;
    Py_ssize_t per = g->slot, mx = 0;
    if (me == root)
        for (int q = 0; q < n; q++)
            if (q != me && outs->len[q] > mx)
                mx = outs->len[q];
    Sig s = {OP_GATHER | g->tag, dtype, 0, root, (uint64_t)inlen, (uint64_t)pieces_of(mx, per), 0};
    g->op_pieces = s.pieces;
    uint64_t M = me == root ? s.pieces : 1;
    for (uint64_t j = 0; j < M; j++) {
        Py_ssize_t off = (Py_ssize_t)j * per;
        uint64_t p;
        if ((rc = begin_piece(g, dl, sv, &p)))
            return rc;
        write_hdr(g, p, &s);
        if (me != root && inlen > off)
            memcpy(DATA(g, me, p), inp + off, min_ss(per, inlen - off));
        publish(g, &CTL(g, me)->post, 2 * p + 1);
        if (me == root) {
            if (j == 0 && outs->ptr[me] != inp)
                memmove(outs->ptr[me], inp, min_ss(inlen, outs->len[me]));
            for (int q = 0; q < n; q++) {
                if (q == me)
                    continue;
                if ((rc = wait_check(g, q, 2 * p + 1, p, &s, 1, (uint64_t)outs->len[q], dl, sv)))
                    return rc;
                if (outs->len[q] > off)
                    memcpy(outs->ptr[q] + off, DATA(g, q, p), min_ss(per, outs->len[q] - off));
            }
        } else {
            /* the root's header says how many pieces the op has */
            if ((rc = wait_ge(g, root, 0, 2 * p + 1, dl, sv)))
                return rc;
            hdr_t *h = HDR(g, root, p);
            if (h->piece != p || h->op != s.op || h->dtype != s.dtype || h->root != root) {
                g->err_peer = root;
                memcpy(&g->err_theirs, h, sizeof(hdr_t));
                return E_MISMATCH;
            }
            if (j == 0)
                M = h->pieces;
        }
        publish(g, &CTL(g, me)->done, p);
    }
    return E_OK;
}

/* ------------------------------------------------------------------ Python glue */
static void fail_self(Group *g, int cause)
{
    ctl_t *c = CTL(g, g->rank);
    uint32_t alive = ST_ALIVE;
    atomic_store(&c->cause, cause);
    atomic_compare_exchange_strong(&c->state, &alive, ST_FAILED);
    ring_bell(c);
    g->broken = 1;
}

/* With the GIL: cma_wait_readers when the failed op posted block addresses; then none are. */
static void release_addrs(Group *g)
{
    if (!g->addr_piece)
        return;
    Py_BEGIN_ALLOW_THREADS
    cma_wait_readers(g);
    Py_END_ALLOW_THREADS
    g->addr_piece = 0;
}

static PyObject *raise_err(Group *g, int rc)
{
    /* a mismatch in the first piece of one-piece calls on both sides: both ranks are at the
     * same piece, nothing of the op is pending: finish the piece and keep the group */
    int recoverable = rc == E_MISMATCH && g->piece == g->op_first && g->op_pieces <= 1 && g->err_theirs.pieces <= 1 &&
                      !g->addr_piece && !g->err_prior; /* (a peer still to come would read block addresses: see below) */
    /* (a failure found settling an earlier broadcast breaks the group: this rank's calls since
     * it returned from that one pair with its peers' in an order it cannot know) */
    /* a timeout waiting for a peer's final post of a one-piece op, this rank's own final
     * post out: the peer, once it comes, finds all it needs here (this rank overwrites
     * that slot only after the peer's done): give up the piece, keep the group */
    /* (not when its post holds block addresses: the late peer would read them from a buffer
     * the caller has reused) */
    if ((rc == E_TIMEOUT || rc == E_STALLED) && g->piece == g->op_first && g->op_pieces <= 1 && g->err_word == 0 &&
        g->err_waited == 2 * g->piece + 1 && !g->addr_piece && !g->err_prior &&
        atomic_load_explicit(&CTL(g, g->rank)->post, memory_order_relaxed) == 2 * g->piece + 1)
        recoverable = 1;
    if (recoverable) {
        publish(g, &CTL(g, g->rank)->done, g->piece);
        /* its notice turns final (the state stays alive): a rank waiting on this one names the
         * cause at once, not at its grace's end */
        ctl_t *me = CTL(g, g->rank);
        atomic_store(&me->stall_rank, (rc == E_STALLED ? g->err_cause : g->err_peer) | STALL_FINAL);
        atomic_store_explicit(&me->stall_piece, g->piece + 1, memory_order_release);
        ring_bell(me);
    }
    if (rc == E_SIGNAL || rc == E_PY) {
        fail_self(g, -1);
        release_addrs(g);
        return NULL; /* the Python exception is set */
    }
    if (rc == E_NEWS) {
        /* the watched TCP group's failure: broken, but not posted here, so that the caller posts
         * the cause that failure names (``fail``; native/_twolevel.py) and no peer reads this
         * rank as the cause meanwhile */
        g->broken = 1;
        release_addrs(g);
        PyObject *args = Py_BuildValue("(siiN)", E_NAMES[rc], -1, -1, Py_BuildValue("(iKO)", 0, 0ULL, Py_None));
        if (args) {
            PyErr_SetObject(Error, args);
            Py_DECREF(args);
        }
        return NULL;
    }
    int cause = rc == E_FAILED ? (g->err_cause >= 0 ? g->err_cause : g->err_peer)
              : rc == E_STALLED ? g->err_cause : g->err_peer;
    if (rc == E_SELF_FAILED) {
        cause = g->err_cause;
        g->err_peer = cause;
        g->broken = 1;
    }
    if (rc != E_SELF_CLOSED && rc != E_SELF_FAILED && !recoverable)
        /* a timeout: -2 - the rank waited on (the root cause), so that a rank waiting on this one names it */
        fail_self(g, rc == E_TIMEOUT || rc == E_STALLED ? -2 - cause : rc == E_MISMATCH ? -1 : cause);
    release_addrs(g);
    if (g->err_prior && rc != E_SELF_CLOSED && rc != E_SELF_FAILED)
        g->broken = 1;
    hdr_t *h = &g->err_theirs, *o = &g->err_ours;
    /* a failure settling an earlier broadcast carries it: (op, dtype, root, nbytes, seq, esize) */
    PyObject *ours = g->err_prior ? Py_BuildValue("(iiiKKK)", o->op, o->dtype, o->root, (unsigned long long)o->nbytes,
                                                  (unsigned long long)o->seq, (unsigned long long)o->esize)
                                  : (Py_INCREF(Py_None), Py_None);
    if (!ours)
        return NULL;
    PyObject *theirs = rc == E_MISMATCH
        ? Py_BuildValue("(iiiiKKKLLN)", h->op, h->dtype, h->redop, h->root, (unsigned long long)h->nbytes,
                        (unsigned long long)h->seq, (unsigned long long)h->esize, (long long)g->err_sends,
                        (long long)g->err_wants, ours)
        : Py_BuildValue("(iKN)", g->err_word, (unsigned long long)g->err_waited, ours);
    if (!theirs)
        return NULL;
    PyObject *args = Py_BuildValue("(siiN)", E_NAMES[rc], g->err_peer, cause, theirs);
    if (args) {
        PyErr_SetObject(Error, args);
        Py_DECREF(args);
    }
    return NULL;
}

static int check_usable(Group *g)
{
    if (g->broken) {
        PyErr_SetString(PyExc_RuntimeError, "native group is broken by an earlier failure");
        return -1;
    }
    return 0;
}

static void Group_dealloc(Group *g)
{
    if (g->maps) {
        for (int r = 0; r < g->size; r++)
            if (g->maps[r].obj)
                PyBuffer_Release(&g->maps[r]);
        PyMem_Free(g->maps);
    }
    PyMem_Free(g->base);
    PyMem_Free(g->pids);
    PyMem_Free(g->cma_sel);
    PyMem_Free(g->cma_from);
    Py_CLEAR(g->on_stall);
    Py_CLEAR(g->on_deadline);
    Py_CLEAR(g->watch);
    Py_TYPE(g)->tp_free((PyObject *)g);
}

static int Group_init(Group *g, PyObject *args, PyObject *kw)
{
    static char *kws[] = {"rank", "size", "maps", "slot", "pids", "timeout", "spin_us", NULL};
    PyObject *maps, *pids;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iiOnOdd", kws, &g->rank, &g->size, &maps, &g->slot, &pids,
                                     &g->timeout, &g->spin_us))
        return -1;
    g->spin_now_us = g->spin_us;
    if (g->size < 1 || g->rank < 0 || g->rank >= g->size || g->slot < ALIGN || g->slot % ALIGN) {
        PyErr_Format(PyExc_ValueError, "Group: bad geometry rank=%d size=%d slot=%zd", g->rank, g->size, g->slot);
        return -1;
    }
    if (PySequence_Size(maps) != g->size || PySequence_Size(pids) != g->size) {
        PyErr_Format(PyExc_ValueError, "Group: expected %d maps and pids", g->size);
        return -1;
    }
    g->data_off = (HDR_BYTES + 8 * (Py_ssize_t)g->size + ALIGN - 1) / ALIGN * ALIGN;
    g->stride = (g->data_off + g->slot + 4095) / 4096 * 4096;
    g->maps = PyMem_Calloc(g->size, sizeof(Py_buffer));
    g->base = PyMem_Calloc(g->size, sizeof(char *));
    g->pids = PyMem_Calloc(g->size, sizeof(int32_t));
    g->cma_sel = PyMem_Calloc(g->size, 1);
    g->cma_from = PyMem_Calloc(g->size, 1);
    if (!g->maps || !g->base || !g->pids || !g->cma_sel || !g->cma_from) {
        PyErr_NoMemory();
        return -1;
    }
    for (int r = 0; r < g->size; r++) {
        PyObject *m = PySequence_GetItem(maps, r);
        PyObject *pid = PySequence_GetItem(pids, r);
        int bad = !m || !pid || get_buf(m, &g->maps[r], 1) < 0;
        if (!bad)
            g->pids[r] = (int32_t)PyLong_AsLong(pid);
        Py_XDECREF(m);
        Py_XDECREF(pid);
        if (bad || PyErr_Occurred())
            return -1;
        if (g->maps[r].len < CTL_BYTES + 2 * g->stride) {
            PyErr_Format(PyExc_ValueError, "Group: rank %d's map has %zd bytes, expected at least %zd", r,
                         g->maps[r].len, CTL_BYTES + 2 * g->stride);
            return -1;
        }
        g->base[r] = g->maps[r].buf;
    }
    CTL(g, g->rank)->pid = (int32_t)getpid();
    /* the probe target (cma.h): published before this rank's first post (release) */
    atomic_store_explicit(&CTL(g, g->rank)->addr, (uint64_t)(uintptr_t)CTL(g, g->rank), memory_order_relaxed);
    return 0;
}

/* An op's start, before it releases the GIL (the Python methods' RUN and the C interface's
 * nd_shm_run): its per-op state reset; returns its deadline */
static double op_begin(Group *g)
{
    g->op_first = 0;
    g->op_base = g->piece;
    g->err_prior = 0;
    g->err_sends = g->err_wants = -1;
    g->op_pieces = 1;
    g->addr_piece = 0;
    double start = now_s();
    ND_SET(g->op_start, start);
    g->in_grace = 0;
    if (atomic_load_explicit(&CTL(g, g->rank)->stall_piece, memory_order_relaxed))
        atomic_store(&CTL(g, g->rank)->stall_piece, 0); /* past the op it timed out in */
    g->warn_at = g->warn_after > 0 ? start + g->warn_after : 1e300;
    return start + g->timeout;
}

#define RUN(call)                                                                                                 \
    do {                                                                                                          \
        double dl = op_begin(g);                                                                                  \
        PyThreadState *sv_ = PyEval_SaveThread();                                                                 \
        PyThreadState **sv = &sv_;                                                                                \
        rc = (call);                                                                                              \
        PyEval_RestoreThread(sv_);                                                                                \
    } while (0)

static PyObject *Group_all_reduce(Group *g, PyObject *args)
{
    int rsag, rc;
    Red r;
    Py_buffer b;
    if (check_usable(g) || red_args(args, "OiinOp", &r, &b, &rsag) < 0)
        return NULL;
    RUN(run_all_reduce(g, b.buf, b.len, &r, rsag && g->size > 1, dl, sv));
    PyBuffer_Release(&b);
    if (rc)
        return raise_err(g, rc);
    Py_RETURN_NONE;
}

static PyObject *Group_reduce(Group *g, PyObject *args)
{
    int root, rc;
    Red r;
    Py_buffer b;
    if (check_usable(g) || red_args(args, "OiinOi", &r, &b, &root) < 0)
        return NULL;
    RUN(run_reduce(g, b.buf, b.len, &r, root, dl, sv));
    PyBuffer_Release(&b);
    if (rc)
        return raise_err(g, rc);
    Py_RETURN_NONE;
}

static PyObject *Group_broadcast(Group *g, PyObject *args)
{
    PyObject *o;
    int dtype, root, rc;
    if (!PyArg_ParseTuple(args, "Oii", &o, &dtype, &root) || check_usable(g))
        return NULL;
    Py_buffer b;
    if (get_buf(o, &b, g->rank != root) < 0) /* the root only reads its buffer: read-only is fine */
        return NULL;
    RUN(run_broadcast(g, b.buf, b.len, dtype, root, dl, sv));
    PyBuffer_Release(&b);
    if (rc)
        return raise_err(g, rc);
    Py_RETURN_NONE;
}

static PyObject *Group_barrier(Group *g, PyObject *noargs)
{
    int rc;
    if (check_usable(g))
        return NULL;
    RUN(run_barrier(g, dl, sv));
    if (rc)
        return raise_err(g, rc);
    Py_RETURN_NONE;
}

/* the buffers of a list op: up to two lists of g->size buffers and one single buffer */
typedef struct {
    Held list[2];
    int nlists;
    Py_buffer one;
} Bufs;

static void bufs_release(Bufs *b)
{
    if (b->one.obj)
        PyBuffer_Release(&b->one);
    for (int i = 0; i < b->nlists; i++)
        held_release(&b->list[i]);
}

/* l0 (and l1 when not NULL): lists (Py_None: every buffer absent); one: a buffer or NULL;
 * w*: writable. On failure everything taken is released and a Python error is set. */
static int bufs_get(Group *g, Bufs *b, PyObject *l0, int w0, PyObject *l1, int w1, PyObject *one, int wone)
{
    memset(b, 0, sizeof *b);
    if (held_get(&b->list[0], l0, g->size, w0) < 0)
        return -1;
    b->nlists = 1;
    if (l1) {
        if (held_get(&b->list[1], l1, g->size, w1) < 0)
            goto fail;
        b->nlists = 2;
    }
    if (one && get_buf(one, &b->one, wone) < 0)
        goto fail;
    return 0;
fail:
    bufs_release(b);
    return -1;
}

static inline List bufs_list(Bufs *b, int i) { return (List){b->list[i].ptr, b->list[i].len}; }

/* after a list op ran: release its buffers, raise its error */
static PyObject *bufs_done(Group *g, Bufs *b, int rc)
{
    bufs_release(b);
    if (rc)
        return raise_err(g, rc);
    Py_RETURN_NONE;
}

static PyObject *Group_all_gather(Group *g, PyObject *args)
{
    PyObject *outs, *inp;
    int dtype, rc;
    Bufs b;
    if (!PyArg_ParseTuple(args, "OOi", &outs, &inp, &dtype) || check_usable(g) ||
        bufs_get(g, &b, outs, 1, NULL, 0, inp, 0) < 0)
        return NULL;
    List lo = bufs_list(&b, 0);
    RUN(run_all_gather(g, &lo, b.one.buf, b.one.len, dtype, dl, sv));
    return bufs_done(g, &b, rc);
}

static PyObject *Group_gather(Group *g, PyObject *args)
{
    PyObject *outs, *inp;
    int dtype, root, rc;
    Bufs b;
    if (!PyArg_ParseTuple(args, "OOii", &outs, &inp, &dtype, &root) || check_usable(g) ||
        bufs_get(g, &b, g->rank == root ? outs : Py_None, 1, NULL, 0, inp, 0) < 0)
        return NULL;
    List lo = bufs_list(&b, 0);
    RUN(run_gather(g, &lo, b.one.buf, b.one.len, dtype, root, dl, sv));
    return bufs_done(g, &b, rc);
}

static PyObject *Group_scatter(Group *g, PyObject *args)
{
    PyObject *out, *ins;
    int dtype, root, rc;
    Bufs b;
    if (!PyArg_ParseTuple(args, "OOii", &out, &ins, &dtype, &root) || check_usable(g) ||
        bufs_get(g, &b, g->rank == root ? ins : Py_None, 0, NULL, 0, out, 1) < 0)
        return NULL;
    List li = bufs_list(&b, 0);
    RUN(run_scatter(g, b.one.buf, b.one.len, &li, dtype, root, dl, sv));
    return bufs_done(g, &b, rc);
}

/* all_to_all(outs, ins, dtype[, out_counts, in_counts, esize]): with the counts, outs and ins
 * are one buffer each, cut at them (the uneven single-buffer form: no per-rank views) */
static PyObject *Group_all_to_all(Group *g, PyObject *args)
{
    PyObject *outs, *ins, *oc = NULL, *ic = NULL;
    Py_ssize_t esize = 0;
    int dtype, rc;
    Bufs b;
    if (!PyArg_ParseTuple(args, "OOi|OOn", &outs, &ins, &dtype, &oc, &ic, &esize) || check_usable(g))
        return NULL;
    if (oc || ic) {
        if (!oc || !ic) {
            PyErr_SetString(PyExc_TypeError, "all_to_all: both counts or neither");
            return NULL;
        }
        if (bufs_get(g, &b, Py_None, 1, Py_None, 0, NULL, 0) < 0)
            return NULL;
        if (held_cut(&b.list[0], outs, oc, esize, 1) < 0 || held_cut(&b.list[1], ins, ic, esize, 0) < 0) {
            bufs_release(&b);
            return NULL;
        }
    } else if (bufs_get(g, &b, outs, 1, ins, 0, NULL, 0) < 0)
        return NULL;
    List lo = bufs_list(&b, 0), li = bufs_list(&b, 1);
    RUN(run_all_to_all(g, &lo, &li, dtype, dl, sv));
    return bufs_done(g, &b, rc);
}

static PyObject *Group_reduce_scatter(Group *g, PyObject *args)
{
    PyObject *out, *ins, *fb;
    int dtype, redop, rc;
    Py_ssize_t esize;
    Red r;
    Bufs b;
    if (!PyArg_ParseTuple(args, "OOiinO", &out, &ins, &dtype, &redop, &esize, &fb) || check_usable(g) ||
        red_init(&r, dtype, redop, esize, fb) < 0 || bufs_get(g, &b, ins, 0, NULL, 0, out, 1) < 0)
        return NULL;
    List li = bufs_list(&b, 0);
    RUN(run_reduce_scatter(g, b.one.buf, b.one.len, &li, &r, dl, sv));
    return bufs_done(g, &b, rc);
}

static PyObject *Group_close(Group *g, PyObject *noargs)
{
    ctl_t *c = CTL(g, g->rank);
    uint32_t alive = ST_ALIVE;
    atomic_compare_exchange_strong(&c->state, &alive, ST_CLOSED);
    ring_bell(c);
    Py_RETURN_NONE;
}

static PyObject *Group_fail(Group *g, PyObject *arg)
{
    long cause = PyLong_AsLong(arg);
    if (cause == -1 && PyErr_Occurred())
        return NULL;
    fail_self(g, (int)cause);
    Py_RETURN_NONE;
}

/* The timeout notice of a wait elsewhere (another group, point to point): this rank, idle
 * here, passed a deadline waiting on ``code`` (a group rank, or STALL_GLOBAL + a global rank;
 * with STALL_FINAL: it raised naming it).
 * A peer whose own deadline passes waiting on this rank names it; cleared at this rank's next op. */
static PyObject *Group_tell_stalled(Group *g, PyObject *arg)
{
    long code = PyLong_AsLong(arg);
    if (code == -1 && PyErr_Occurred())
        return NULL;
    ctl_t *me = CTL(g, g->rank);
    atomic_store(&me->stall_rank, (int32_t)code);
    atomic_store_explicit(&me->stall_piece, g->piece + 1, memory_order_release);
    ring_bell(me);
    Py_RETURN_NONE;
}

/* what this rank waits on, for a timeout's message: (piece, [(post, done, state), ...]) */
static PyObject *Group_progress(Group *g, PyObject *noargs)
{
    PyObject *lst = PyList_New(g->size);
    if (!lst)
        return NULL;
    for (int q = 0; q < g->size; q++) {
        ctl_t *c = CTL(g, q);
        PyObject *t = Py_BuildValue("(KKI)", (unsigned long long)atomic_load(&c->post),
                                    (unsigned long long)atomic_load(&c->done), (unsigned)atomic_load(&c->state));
        if (!t) {
            Py_DECREF(lst);
            return NULL;
        }
        PyList_SET_ITEM(lst, q, t);
    }
    return Py_BuildValue("(KN)", (unsigned long long)ND_GET(g->piece), lst);
}

static PyMethodDef Group_methods[] = {
    {"all_reduce", (PyCFunction)Group_all_reduce, METH_VARARGS,
     "all_reduce(buf, dtype, redop, esize, fallback, rsag): in place, rank-order reduction"},
    {"reduce", (PyCFunction)Group_reduce, METH_VARARGS, "reduce(buf, dtype, redop, esize, fallback, root)"},
    {"broadcast", (PyCFunction)Group_broadcast, METH_VARARGS, "broadcast(buf, dtype, root)"},
    {"barrier", (PyCFunction)Group_barrier, METH_NOARGS, "barrier()"},
    {"all_gather", (PyCFunction)Group_all_gather, METH_VARARGS, "all_gather(outs, inp, dtype)"},
    {"gather", (PyCFunction)Group_gather, METH_VARARGS, "gather(outs or None, inp, dtype, root)"},
    {"scatter", (PyCFunction)Group_scatter, METH_VARARGS, "scatter(out, ins or None, dtype, root)"},
    {"all_to_all", (PyCFunction)Group_all_to_all, METH_VARARGS, "all_to_all(outs, ins, dtype)"},
    {"reduce_scatter", (PyCFunction)Group_reduce_scatter, METH_VARARGS,
     "reduce_scatter(out, ins, dtype, redop, esize, fallback)"},
    {"close", (PyCFunction)Group_close, METH_NOARGS, "mark this rank closed (peers waiting on it fail)"},
    {"fail", (PyCFunction)Group_fail, METH_O, "fail(cause_rank): mark this rank failed (peers relay it)"},
    {"progress", (PyCFunction)Group_progress, METH_NOARGS, "(piece, [(post, done, state) per rank])"},
    {"tell_stalled", (PyCFunction)Group_tell_stalled, METH_O,
     "tell_stalled(code): idle here, this rank timed out elsewhere waiting on code (see STALL_GLOBAL)"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Group_members[] = {
    {"seq", T_ULONGLONG, offsetof(Group, seq), 0, "sequence number of the next op (goes into its header)"},
    {"tag", T_INT, offsetof(Group, tag), 0,
     "ORed into the op code of the headers this rank writes and expects (above bit 8: the two-level engine's call)"},
    {"broken", T_INT, offsetof(Group, broken), READONLY, "1 once a failure broke the group (every later op fails)"},
    {"on_stall", T_OBJECT, offsetof(Group, on_stall), 0,
     "on_stall(peer, word, waited_s, left_s), called with the GIL from a wait of warn_after seconds"},
    {"warn_after", T_DOUBLE, offsetof(Group, warn_after), 0, "seconds an op waits before on_stall (0: never)"},
    {"timeout", T_DOUBLE, offsetof(Group, timeout), READONLY, "an op's timeout in seconds"},
    {"spin_us", T_DOUBLE, offsetof(Group, spin_us), READONLY, "how long a wait spins before it sleeps, at first (µs)"},
    {"spin_now_us", T_DOUBLE, offsetof(Group, spin_now_us), READONLY,
     "how long this rank's next wait spins (µs): spin_us, doubled after each sleep a peer ended within 2 ms, up to 10 x"},
    {"cma_min", T_PYSSIZET, offsetof(Group, cma_min), 0,
     "all_to_all blocks of at least this many bytes go by address to peers that can read them (0: never)"},
    {"bcast_min", T_PYSSIZET, offsetof(Group, bcast_min), 0,
     "a broadcast of at least this many bytes goes by address where every receiver can read the root (0: never)"},
    {"bcast_max", T_PYSSIZET, offsetof(Group, bcast_max), 0,
     "... and of at most this many bytes (0: no bound)"},
    {"gather_min", T_PYSSIZET, offsetof(Group, gather_min), 0,
     "an all_gather input of at least this many bytes goes by address where every peer can read it (0: never)"},
    {"cma_blocks", T_ULONGLONG, offsetof(Group, cma_blocks), READONLY,
     "all_to_all blocks, all_gather parts and broadcast buffers this rank read from a peer's memory with one copy (process_vm_readv)"},
    {"on_deadline", T_OBJECT, offsetof(Group, on_deadline), 0,
     "on_deadline(code), called with the GIL when an op's deadline passes (and when its notice is refined) "
     "naming code: a group rank, or STALL_GLOBAL + a global rank"},
    {NULL, 0, 0, 0, NULL},
};

static PyObject *Group_get_watch(Group *g, void *closure)
{
    PyObject *w = g->watch ? g->watch : Py_None;
    Py_INCREF(w);
    return w;
}

/* Set before the group's first op, and left until it is freed (a wait on another thread reads
 * it without the GIL). */
static int Group_set_watch(Group *g, PyObject *value, void *closure)
{
    if (value != NULL && value != Py_None && !nd_tcp_is(value)) {
        PyErr_Format(PyExc_TypeError, "watch: expected a TcpGroup or None, got %s", Py_TYPE(value)->tp_name);
        return -1;
    }
    PyObject *old = g->watch;
    g->watch = value == Py_None ? NULL : value;
    Py_XINCREF(g->watch);
    Py_XDECREF(old);
    return 0;
}

/* (read while an op runs on another thread, for a waiting op's message: atomic loads) */
static PyObject *Group_get_piece(Group *g, void *closure)
{
    return PyLong_FromUnsignedLongLong(ND_GET(g->piece));
}

static PyObject *Group_get_op_start(Group *g, void *closure) { return PyFloat_FromDouble(ND_GET(g->op_start)); }

static PyGetSetDef Group_getset[] = {
    {"watch", (getter)Group_get_watch, (setter)Group_set_watch,
     "a TcpGroup whose failures (a peer's FAIL frame, this op's frame sent direct) end a wait here "
     "(error kind 'news': its TcpGroup.raise_news raises it), or None", NULL},
    {"piece", (getter)Group_get_piece, NULL, "pieces run so far", NULL},
    {"op_start", (getter)Group_get_op_start, NULL,
     "when the latest op began (CLOCK_MONOTONIC seconds, as time.monotonic())", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject GroupType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ndist._cnative.Group",
    .tp_basicsize = sizeof(Group),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Group_init,
    .tp_dealloc = (destructor)Group_dealloc,
    .tp_methods = Group_methods,
    .tp_members = Group_members,
    .tp_getset = Group_getset,
    .tp_doc = "One rank's view of a same-host group's shared-memory slots (see the module source).",
};

/* ------------------------------------------------------------------ the C interface's entry (engines.h) */
int nd_shm_is(PyObject *o) { return Py_TYPE(o) == &GroupType; }

void nd_shm_set_seq(PyObject *o, unsigned long long seq) { ((Group *)o)->seq = seq; }

void nd_shm_geometry(PyObject *o, int *rank, int *size)
{
    *rank = ((Group *)o)->rank;
    *size = ((Group *)o)->size;
}

/* ``n`` equal blocks of ``len`` bytes from ``base`` */
static void cut_even(List *l, char *base, Py_ssize_t len, int n)
{
    for (int q = 0; q < n; q++) {
        l->ptr[q] = base + q * len;
        l->len[q] = len;
    }
}

/* ``n`` blocks of ``counts[q]`` elements of ``esize`` bytes, in order from ``base`` */
static void cut_counts(List *l, char *base, const Py_ssize_t *counts, Py_ssize_t esize, int n)
{
    for (int q = 0; q < n; q++) {
        l->ptr[q] = base;
        l->len[q] = counts[q] * esize;
        base += l->len[q];
    }
}

int nd_shm_run(PyObject *o, const NdOp *op, PyThreadState **sv)
{
    Group *g = (Group *)o;
    if (g->broken)
        return ND_SHM_BROKEN;
    int n = g->size, rc;
    Red r = {op->dtype, op->redop, op->esize, op->fallback};
    if (op->op == OP_ALL_REDUCE || op->op == OP_REDUCE || op->op == OP_BROADCAST || op->op == OP_BARRIER) {
        double dl = op_begin(g);
        if (op->op == OP_ALL_REDUCE)
            return run_all_reduce(g, op->out, op->outbytes, &r, op->rsag && n > 1, dl, sv);
        if (op->op == OP_REDUCE)
            return run_reduce(g, op->out, op->outbytes, &r, op->root, dl, sv);
        if (op->op == OP_BROADCAST)
            return run_broadcast(g, op->out, op->outbytes, op->dtype, op->root, dl, sv);
        return run_barrier(g, dl, sv);
    }
    /* the list ops: one buffer cut in n equal blocks (or this rank's one block) */
    char **ptr = malloc(2 * (size_t)n * sizeof(char *));
    Py_ssize_t *len = malloc(2 * (size_t)n * sizeof(Py_ssize_t));
    if (!ptr || !len) {
        free(ptr);
        free(len);
        return ND_SHM_NOMEM;
    }
    List a = {ptr, len}, b = {ptr + n, len + n};
    double dl = op_begin(g);
    if (op->op == OP_ALL_GATHER) {
        cut_even(&a, op->out, op->outbytes / n, n);
        rc = run_all_gather(g, &a, (char *)op->in, op->inbytes, op->dtype, dl, sv);
    } else if (op->op == OP_ALL_TO_ALL) {
        if (op->out_counts) { /* split sizes: cut at them */
            cut_counts(&a, op->out, op->out_counts, op->esize, n);
            cut_counts(&b, (char *)op->in, op->in_counts, op->esize, n);
        } else {
            cut_even(&a, op->out, op->outbytes / n, n);
            cut_even(&b, (char *)op->in, op->inbytes / n, n);
        }
        rc = run_all_to_all(g, &a, &b, op->dtype, dl, sv);
    } else {
        cut_even(&b, (char *)op->in, op->inbytes / n, n);
        rc = run_reduce_scatter(g, op->out, op->outbytes, &b, &r, dl, sv);
    }
    free(ptr);
    free(len);
    return rc;
}

void nd_shm_set_tag(PyObject *o, int tag) { ((Group *)o)->tag = tag; }

int nd_shm_all_gather(PyObject *o, char **outs, Py_ssize_t *olen, const char *in, Py_ssize_t inbytes, int dtype,
                      PyThreadState **sv)
{
    Group *g = (Group *)o;
    if (g->broken)
        return ND_SHM_BROKEN;
    List a = {outs, olen};
    double dl = op_begin(g);
    return run_all_gather(g, &a, (char *)in, inbytes, dtype, dl, sv);
}

int nd_shm_scatter_to(PyObject *o, int to, char *buf, Py_ssize_t nbytes, int dtype, PyThreadState **sv)
{
    Group *g = (Group *)o;
    if (g->broken)
        return ND_SHM_BROKEN;
    int n = g->size, me = g->rank, rc;
    char **ptr = calloc((size_t)n, sizeof(char *));
    Py_ssize_t *len = calloc((size_t)n, sizeof(Py_ssize_t));
    if (!ptr || !len) {
        free(ptr);
        free(len);
        return ND_SHM_NOMEM;
    }
    static char none[1]; /* (the empty blocks, and the output of a rank that gets nothing) */
    List ins = {ptr, len};
    for (int q = 0; q < n; q++)
        ptr[q] = none;
    if (me == 0)
        ptr[to] = buf, len[to] = nbytes;
    double dl = op_begin(g);
    rc = run_scatter(g, me == to ? buf : none, me == to ? nbytes : 0, &ins, dtype, 0, dl, sv);
    free(ptr);
    free(len);
    return rc;
}

PyObject *nd_shm_raise(PyObject *o, int rc)
{
    if (rc == ND_SHM_BROKEN) { /* what check_usable raises */
        PyErr_SetString(PyExc_RuntimeError, "native group is broken by an earlier failure");
        return NULL;
    }
    if (rc == ND_SHM_NOMEM)
        return PyErr_NoMemory();
    return raise_err((Group *)o, rc);
}

/* element bytes per dtype code (_frame._DTYPES) */
static const Py_ssize_t ESIZE[] = {0, 1, 1, 1, 2, 2, 4, 4, 8, 8, 2, 4, 8, 8, 16, 2, 1, 1};

/* reduce(dst, a, b, dtype, op) -> int: the kernel alone; 0, or -1 when it has none for the pair */
static PyObject *mod_reduce(PyObject *self, PyObject *args)
{
    PyObject *od, *oa, *ob;
    int dtype, op;
    if (!PyArg_ParseTuple(args, "OOOii", &od, &oa, &ob, &dtype, &op))
        return NULL;
    Py_ssize_t esize = dtype > 0 && dtype < (int)(sizeof ESIZE / sizeof ESIZE[0]) ? ESIZE[dtype] : 1;
    Py_buffer d, a, b;
    if (get_buf(od, &d, 1) < 0)
        return NULL;
    if (get_buf(oa, &a, 0) < 0) {
        PyBuffer_Release(&d);
        return NULL;
    }
    if (get_buf(ob, &b, 0) < 0) {
        PyBuffer_Release(&d);
        PyBuffer_Release(&a);
        return NULL;
    }
    int rc = -2;
    if (a.len == d.len && b.len == d.len && d.len % esize == 0)
        rc = nd_reduce(d.buf, a.buf, b.buf, (size_t)(d.len / esize), dtype, op);
    PyBuffer_Release(&d);
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    if (rc == -2) {
        PyErr_SetString(PyExc_ValueError, "reduce: buffers of equal length, whole elements, expected");
        return NULL;
    }
    return PyLong_FromLong(rc);
}

static PyObject *mod_supports(PyObject *self, PyObject *args)
{
    int dtype, op;
    if (!PyArg_ParseTuple(args, "ii", &dtype, &op))
        return NULL;
    return PyBool_FromLong(nd_reduce(NULL, NULL, NULL, 0, dtype, op) == 0);
}

static PyMethodDef mod_methods[] = {
    {"reduce", mod_reduce, METH_VARARGS, "reduce(dst, a, b, dtype, op) -> 0, or -1 without a kernel for the pair"},
    {"supports", mod_supports, METH_VARARGS, "supports(dtype, op) -> bool: a native kernel exists"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_cnative", "ndist's native same-host engine", -1,
                                    mod_methods};

PyMODINIT_FUNC PyInit__cnative(void)
{
    main_thread = PyThread_get_thread_ident();
    if (PyType_Ready(&GroupType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moddef);
    if (!m)
        return NULL;
    Error = PyErr_NewException("ndist._cnative.Error", PyExc_RuntimeError, NULL);
    Py_INCREF(&GroupType);
    if (!Error || PyModule_AddObject(m, "Error", Error) < 0 || nd_tcp_add(m, Error, main_thread) < 0 ||
        PyModule_AddObject(m, "Group", (PyObject *)&GroupType) < 0 ||
        PyModule_AddIntConstant(m, "CTL_BYTES", CTL_BYTES) < 0 || PyModule_AddIntConstant(m, "HDR_BYTES", HDR_BYTES) < 0 ||
        PyModule_AddIntConstant(m, "STALL_GLOBAL", STALL_GLOBAL) < 0 ||
        PyModule_AddIntConstant(m, "STALL_FINAL", STALL_FINAL) < 0 || nd_capi_add(m) < 0 || nd_lane_add(m) < 0 ||
        nd_two_add(m) < 0 || nd_record_add(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
