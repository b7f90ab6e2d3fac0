/* ndist's native engine over TCP (``_cnative.TcpGroup``): a group's collectives across
 * hosts, each one call into C with the GIL released, over one connected stream socket per
 * peer (the collective links the socket backend's mesh dialled and authenticated; this
 * group owns their descriptors from then on).
 *
 * Wire: every message is a *frame*, a 64-byte header (``thdr_t``) and ``nbytes`` of payload.
 *
 *     DATA   one rank's part of a collective for one peer in one phase, with the call's
 *            signature (op, dtype, redop, root, sig, esize, phase) that the receiver checks
 *     FAIL   the sender's group broke: ``why`` W_FAILED (``code``: the rank it names, -1 the
 *            sender itself), W_STALLED (it timed out waiting on rank ``code``) or
 *            W_MISMATCH (its own call's signature is the header's)
 *     CLOSE  the sender closed the group (destroy_process_group, exit)
 *     STALL  the sender, idle here, passed a deadline elsewhere waiting on ``code`` (a group
 *            rank, or STALL_GLOBAL + a global rank; STALL_FINAL: it raised naming it)
 *     DONE   the sender read the payload of this rank's DATA frame of the phase by address
 *
 * Single copy: a DATA payload of at least ``cma_min`` bytes for a peer on this host that may
 * read this rank's memory (``they_read``: the link's facts, which both ends agreed on when
 * it opened) is not sent: the header carries its address (``addr``), the peer reads it with
 * ``process_vm_readv`` (cma.h) straight into its destination and answers DONE after its own
 * DATA frame of the phase to this rank (if any); this rank's phase ends only once that DONE came, so
 * the caller's buffer is its own again when the op returns. A read that fails (the sender
 * died) is a lost link (E_LOST) naming the sender.
 *
 * One frame of another format may come too: the mesh's lost notice (the Python engine's ABORT
 * frame, ``wire/_frame.py``), which a rank that could not build or keep the group writes on
 * the collective links it holds before it ends their sending side (``Mesh.abandon``): read
 * whole and raised to Python with its reason (E_ABORT), which names the lost rank.
 *
 * The algorithms are direct: a collective is one phase (two for a large all_reduce:
 * reduce-scatter, then all-gather), and in a phase every rank sends at most one DATA frame
 * to each peer and receives at most one from each. A frame is read exactly (its header,
 * then its payload straight into the destination), so a stream never holds a later op's
 * bytes that were read early. Reductions fold in rank order, so every rank's result is
 * bit-identical to every other's and to the same-host engine's.
 *
 * Progress: all sends and receives of a phase go together on non-blocking sockets
 * (``sendmsg`` of header and payload, ``recv`` into the destination); a rank with nothing
 * to do spins for ``spin_now_us``, yields for 2 ms, then waits in ``poll`` in 20 ms ticks, at
 * each of which it looks at its deadline, pending signals (main thread), the stall warning
 * and this group's eventfd, which ``fail`` / ``close`` from another thread write. Every
 * progress (bytes sent or received) starts a new wait: spin, yield, poll again, so a large
 * phase, which waits on its sockets many times, does not sleep in ``poll`` at each wait once
 * its first 2 ms are past. A wait that slept in ``poll`` teaches the spin as on one host
 * (common.h ``spin_learn``: woken within 2 ms, the spin doubles, up to 10 x ``spin_us``;
 * later, it goes back to ``spin_us``).
 *
 * Every failure breaks the group (every later op raises the first error, as the Python
 * engine's): the rank sends FAIL (CLOSE for a close) to every peer whose stream is at a
 * frame boundary and shuts down its sending side of every socket, so no peer waits on a
 * rank that stopped; a peer whose frame was cut short reads the end of the stream (E_LOST).
 * Except a mismatch that leaves every stream at the next op's first frame (``keeps``): the
 * rank raises it and the group goes on.
 */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include <Python.h>
#include <pythread.h>
#include <structmember.h>

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "cma.h"
#include "common.h"
#include "ctcp.h"
#include "engines.h"

/* ------------------------------------------------------------------ wire */
#define MAGIC 0x4e445400u /* "NDT" */
enum { K_DATA = 1, K_FAIL, K_CLOSE, K_STALL, K_DONE };
enum { W_FAILED = 1, W_STALLED, W_MISMATCH };

typedef struct {
    uint32_t kind;  /* MAGIC | K_* */
    int32_t op, dtype, redop, root;
    uint32_t phase; /* DATA: the phase of its op */
    union {
        struct {
            int32_t why;  /* FAIL: W_* */
            int32_t code; /* FAIL: the rank named; STALL: the notice */
        };
        /* DATA: the payload's address in the sender's memory, which the receiver reads
         * (cma.h) and answers with DONE; 0: the payload follows on the stream */
        uint64_t addr;
    };
    uint64_t seq;   /* the op's sequence number on its group (for messages) */
    uint64_t sig;   /* the op's size signature (the buffer of all_reduce / reduce / broadcast) */
    uint64_t esize;
    uint64_t nbytes; /* payload bytes that follow */
} thdr_t;
_Static_assert(sizeof(thdr_t) == 64, "a frame header is 64 bytes");

#define YIELD_S 2e-3
#define TICK_MS 20
#define WARN_EVERY 60.0
#define FINAL_FRAME_S 0.2 /* how long a final FAIL / CLOSE frame may wait for room in a socket */
#define DRAIN_BYTES 65536
/* the mesh's lost notice (wire/_frame.py): magic "DN" (u16 0x4E44), kind ABORT (3), a 56-byte
 * header whose u64 at offset 40 is the length of the JSON reason that follows */
#define PY_HDR 56
#define PY_NBYTES_AT 40
#define PY_ABORT 3
#define PY_MAX_ABORT 65536

typedef struct {
    int fd;
    int out_done; /* this side's stream is shut down: nothing more is sent */
    /* the frame being sent: header, then payload; ``ooff`` counts both */
    _Atomic int osend; /* (``irecv`` too: read by another thread's message, ``waiting``; common.h, ND_SET) */
    thdr_t oh;
    const char *optr;
    size_t olen, ooff;
    /* the frame being received: header (``ihgot`` of it), then payload into iptr (igot of ilen) */
    _Atomic int irecv;
    int istage; /* 0: header, 1: payload, 2: draining a mismatched payload */
    thdr_t ih;
    size_t ihgot;
    char *iptr;
    size_t ilen, igot, idrain;
    int32_t told;  /* 1 + the peer's STALL code (0: none), cleared by its next DATA frame */
    /* single copy with a peer on this host (cma.h): ``rpid``, its pid when this rank may read
     * its memory (0: never); ``they_read``, it may read this rank's. ``oaddr``: the frame being
     * sent goes by address (its header alone on the stream); ``idone``: this rank awaits the
     * peer's DONE for it; ``dsend``: a DONE to send the peer (``dh``, ``doff`` of it sent), after
     * this phase's DATA frame to it */
    int32_t rpid;
    int they_read, oaddr;
    _Atomic int idone, dsend; /* (read by another thread's message, ``waiting``, as osend) */
    thdr_t dh;
    size_t doff;
} Peer;

typedef struct {
    int op, dtype, redop, root;
    uint64_t sig, esize;
    uint32_t phase;
    int cmp_sig; /* the receiver compares ``sig`` (the ops whose every rank gives one buffer size) */
} TSig;

typedef struct {
    PyObject_HEAD
    int rank, size;
    Peer *peers;
    int efd;
    double timeout, spin_us;
    double spin_now_us; /* this rank's spin now: spin_us, longer after polls a peer ended soon (xchg) */
    unsigned long long seq;
    unsigned long long ops;
    int broken;
    _Atomic int busy;       /* an op (or fail / close / tell_stalled) holds the sockets */
    _Atomic int want_fail;  /* fail(): 1 + ... set; its cause in fail_cause */
    _Atomic int fail_cause;
    _Atomic int want_close;
    TSig cur;               /* the running op's signature (for FAIL frames) */
    /* the failure being reported */
    int err_peer, err_cause;
    thdr_t err_theirs;
    int64_t err_sends, err_wants;
    /* the stall warning: on_stall(peer, word, waited_s, left_s) once an op waited warn_after
     * seconds (0: never), then every WARN_EVERY seconds */
    PyObject *on_stall;
    double warn_after, warn_at;
    _Atomic double op_start; /* (read by another thread's message: ``op_start``; common.h, ND_SET) */
    /* the deadline passed: this rank told its peers whom it waits on (``posted``: 1 + that code)
     * and waits until grace_end for the notice of the peer it waits on (the root cause) */
    int in_grace;
    double grace_end;
    int32_t posted;
    /* on_deadline(code): called with the GIL when this rank posts a notice (the notice reaches
     * the process's other groups) */
    PyObject *on_deadline;
    char *scratch;
    size_t scratch_len;
    size_t op_need;      /* the scratch the running op asked for (0: none) */
    int scratch_idle;    /* completed ops in a row that needed at most a quarter of a scratch above SCRATCH_KEEP */
    char *drain;
    /* the mesh's lost notice a peer sent (E_ABORT): its JSON reason, the global rank it names
     * (-1: none) and whether it tells of a timeout (kind "stalled") */
    char *abort_body;
    size_t abort_len;
    int abort_rank, abort_stalled;
    /* the ranks an op runs among (``view``): vsize of them, this one vrank-th, vmap[i] the
     * group rank of the i-th (NULL: every rank, in order). The algorithms count in the view;
     * the streams, the waits and every failure count group ranks, so a rank outside the view
     * that fails or closes is still seen (the two-level engine's leaders, native/_twolevel.py).
     * vrank -1: this rank is outside the view; it runs no op, and a DATA frame of the current
     * sequence number that comes to it is a mismatch (``nd_tcp_news``) */
    int vsize, vrank;
    int *vmap;
    /* ORed into the op code of the frames this rank sends and expects (0: none; see cnative.c) */
    int tag;
    /* the error kind a wait elsewhere found (``nd_tcp_news``; 0: none), raised by ``raise_news``
     * or by the next op */
    int news;
    /* the running op's mismatch leaves every stream at the next op's first frame (``keeps``):
     * the group stays usable */
    int keep;
    /* single copy: a DATA payload of at least cma_min bytes (0: never) to a peer that reads
     * this rank's memory goes by address; cma_blocks counts the payloads this rank read so */
    Py_ssize_t cma_min;
    unsigned long long cma_blocks;
} TGroup;

/* the group rank of the view's q-th rank */
#define VQ(g, q) ((g)->vmap ? (g)->vmap[q] : (q))

/* whether group rank q is in the view */
static int in_view(const TGroup *g, int q)
{
    if (!g->vmap)
        return 1;
    for (int i = 0; i < g->vsize; i++)
        if (g->vmap[i] == q)
            return 1;
    return 0;
}

static PyObject *Error; /* _cnative.Error (shared with the same-host engine) */
static unsigned long main_thread;
static PyTypeObject TGroupType;

/* ------------------------------------------------------------------ one phase */
static void clear_phase(TGroup *g)
{
    for (int q = 0; q < g->size; q++) {
        Peer *p = &g->peers[q];
        ND_SET(p->osend, 0), ND_SET(p->irecv, 0), ND_SET(p->idone, 0), ND_SET(p->dsend, 0);
    }
}

/* a frame to this peer is part sent: nothing else may go on its stream before it ends */
static int mid_frame(const Peer *p)
{
    return (p->osend && p->ooff > 0) || (p->dsend && p->doff > 0);
}

/* (q: a rank of the view) */
static void set_send(TGroup *g, int q, const TSig *s, const char *ptr, size_t len)
{
    Peer *p = &g->peers[VQ(g, q)];
    memset(&p->oh, 0, sizeof p->oh);
    p->oh.kind = MAGIC | K_DATA;
    p->oh.op = s->op;
    p->oh.dtype = s->dtype;
    p->oh.redop = s->redop;
    p->oh.root = s->root;
    p->oh.phase = s->phase;
    p->oh.seq = g->seq;
    p->oh.sig = s->sig;
    p->oh.esize = s->esize;
    p->oh.nbytes = len;
    p->optr = ptr;
    p->olen = len;
    p->ooff = 0;
    ND_SET(p->osend, 1);
    /* by address: the peer reads it (single copy) and answers DONE, which ends this rank's
     * phase with it (the buffer is the caller's again once the op returns) */
    p->oaddr = len && g->cma_min > 0 && len >= (size_t)g->cma_min && p->they_read;
    p->oh.addr = p->oaddr ? (uint64_t)(uintptr_t)ptr : 0;
    if (p->oaddr && !p->irecv) { /* (no read of it is under way between phases) */
        p->istage = 0;
        p->ihgot = 0;
    }
    ND_SET(p->idone, p->oaddr);
}

static void set_recv(TGroup *g, int q, char *ptr, size_t len)
{
    Peer *p = &g->peers[VQ(g, q)];
    p->iptr = ptr;
    p->ilen = len;
    p->igot = p->ihgot = 0;
    p->istage = 0;
    ND_SET(p->irecv, 1);
}

/* Queue a DONE for peer q, whose payload this rank read by address (or drained, in a
 * mismatch); it goes after this phase's DATA frame to q. */
static void queue_done(TGroup *g, Peer *p)
{
    memset(&p->dh, 0, sizeof p->dh);
    p->dh.kind = MAGIC | K_DONE;
    p->dh.seq = g->seq;
    p->doff = 0;
    ND_SET(p->dsend, 1);
}

/* 1: progress, 0: would block, -1: the connection failed (E_LOST) */
static int try_send(Peer *p)
{
    struct iovec iov[2];
    int k = 0;
    size_t body = p->oaddr ? 0 : p->olen; /* (the payload bytes on the stream) */
    if (!p->osend) { /* a DONE */
        ssize_t w = send(p->fd, (char *)&p->dh + p->doff, sizeof(thdr_t) - p->doff, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w < 0)
            return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
        p->doff += (size_t)w;
        if (p->doff == sizeof(thdr_t))
            ND_SET(p->dsend, 0);
        return 1;
    }
    if (p->ooff < sizeof(thdr_t)) {
        iov[k].iov_base = (char *)&p->oh + p->ooff;
        iov[k++].iov_len = sizeof(thdr_t) - p->ooff;
        if (body) {
            iov[k].iov_base = (void *)p->optr;
            iov[k++].iov_len = p->olen;
        }
    } else {
        size_t done = p->ooff - sizeof(thdr_t);
        iov[k].iov_base = (void *)(p->optr + done);
        iov[k++].iov_len = p->olen - done;
    }
    struct msghdr m = {0};
    m.msg_iov = iov;
    m.msg_iovlen = k;
    ssize_t w = sendmsg(p->fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w < 0)
        return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
    p->ooff += (size_t)w;
    if (p->ooff == sizeof(thdr_t) + body)
        ND_SET(p->osend, 0);
    return 1;
}

/* the received DATA header against this rank's call: E_OK, or E_MISMATCH (recorded) */
static int check_data(TGroup *g, int q, const TSig *s)
{
    Peer *p = &g->peers[q];
    thdr_t *h = &p->ih;
    if (h->op != s->op || h->dtype != s->dtype || h->redop != s->redop || h->root != s->root ||
        h->phase != s->phase || (s->cmp_sig && h->sig != s->sig)) {
        g->err_sends = g->err_wants = -1;
    } else if (h->nbytes != p->ilen) {
        g->err_sends = (int64_t)h->nbytes;
        g->err_wants = (int64_t)p->ilen;
    } else
        return E_OK;
    g->err_peer = q;
    memcpy(&g->err_theirs, h, sizeof *h);
    return E_MISMATCH;
}

/* A frame's op ends with this frame's phase, in which every rank sends one frame to every
 * other and receives one from each (all_gather, all_to_all, reduce_scatter, barrier, an
 * all_reduce whose frames carry the whole buffer): op, phase and frame bytes, against the
 * op's size signature. */
static int last_full_phase(int op, uint32_t phase, uint64_t nbytes, uint64_t sig)
{
    op &= 0xff; /* (without a two-level tag) */
    return phase == 0 && (op == OP_ALL_GATHER || op == OP_ALL_TO_ALL || op == OP_REDUCE_SCATTER ||
                          op == OP_BARRIER || (op == OP_ALL_REDUCE && nbytes == sig));
}

/* A mismatched phase keeps the group when every stream is at the next op's first frame once
 * it ends: this rank's op and every peer's are one phase in which each rank sends every
 * other one frame and receives one from each, so each rank read one frame from each peer
 * and each peer one from it. A frame of this rank's own call but another size (a per-peer
 * size mismatch, seen by that pair alone: the block one rank sends another is not the one
 * the other expects) is drained whole like any other, so it keeps the group too: the rank
 * that sees it raises, and the sender, whose own reads were all in order, returns, as on
 * the Python engine and on one host. Called for the first mismatched header and each one
 * after it (those before matched); xchg checks this rank's own op. */
static int keeps(TGroup *g, int q, const TSig *s)
{
    thdr_t *h = &g->peers[q].ih;
    int same = h->op == s->op && h->dtype == s->dtype && h->redop == s->redop && h->root == s->root &&
               h->phase == s->phase && (!s->cmp_sig || h->sig == s->sig);
    if (same)
        return 1;
    return !g->vmap && last_full_phase(h->op, h->phase, h->nbytes, h->sig);
}

/* A peer's FAIL frame: the error this rank raises for it */
static int peer_failed(TGroup *g, int q)
{
    thdr_t *h = &g->peers[q].ih;
    g->err_peer = q;
    g->keep = 0;
    if (h->why == W_MISMATCH) {
        memcpy(&g->err_theirs, h, sizeof *h);
        g->err_sends = g->err_wants = -1;
        return E_MISMATCH;
    }
    if (h->why == W_STALLED && h->code != g->rank) { /* it timed out waiting on that rank */
        g->err_cause = h->code;
        return E_STALLED;
    }
    g->err_cause = h->why == W_STALLED ? -1 : h->code; /* (timed out waiting on this rank: it failed) */
    return E_FAILED;
}

/* The header just read is not this engine's: the mesh's lost notice (read whole, E_ABORT), or
 * a stream that cannot be trusted any more (E_LOST). */
static int read_abort(TGroup *g, int q)
{
    Peer *p = &g->peers[q];
    const unsigned char *b = (const unsigned char *)&p->ih;
    uint64_t nbytes;
    g->err_peer = q;
    memcpy(&nbytes, b + PY_NBYTES_AT, sizeof nbytes);
    if (b[0] != 0x44 || b[1] != 0x4E || b[2] != PY_ABORT || nbytes < sizeof(thdr_t) - PY_HDR ||
        nbytes > PY_MAX_ABORT)
        return E_LOST;
    char *body = malloc(nbytes + 1);
    if (!body)
        return E_LOST;
    size_t got = sizeof(thdr_t) - PY_HDR; /* (read with the header) */
    memcpy(body, b + PY_HDR, got);
    double until = now_s() + 1.0; /* (its sender wrote it whole, then ended the stream) */
    while (got < nbytes) {
        ssize_t r = recv(p->fd, body + got, nbytes - got, MSG_DONTWAIT);
        if (r > 0) {
            got += (size_t)r;
            continue;
        }
        if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) || now_s() > until)
            break;
        struct pollfd pf = {p->fd, POLLIN, 0};
        poll(&pf, 1, 10);
    }
    body[got] = 0;
    free(g->abort_body);
    g->abort_body = body;
    g->abort_len = got;
    /* json.dumps of {"kind", "msg", "rank", ...}: a quote inside "msg" is escaped, so the first
     * '"rank": ' is the key */
    g->abort_rank = -1;
    const char *k = strstr(body, "\"rank\": ");
    if (k) {
        char *end;
        long v = strtol(k + 8, &end, 10);
        if (end != k + 8 && v >= 0 && v < STALL_GLOBAL)
            g->abort_rank = (int)v;
    }
    g->abort_stalled = strstr(body, "\"kind\": \"stalled\"") != NULL;
    return E_ABORT;
}

/* 1: progress, 0: would block, else -(an error kind); a mismatch sets *mm and drains */
static int try_recv(TGroup *g, int q, const TSig *s, int *mm)
{
    Peer *p = &g->peers[q];
    int moved = 0;
    for (;;) {
        ssize_t r;
        if (p->istage == 0) {
            r = recv(p->fd, (char *)&p->ih + p->ihgot, sizeof(thdr_t) - p->ihgot, MSG_DONTWAIT);
        } else if (p->istage == 1) {
            r = recv(p->fd, p->iptr + p->igot, p->ilen - p->igot, MSG_DONTWAIT);
        } else {
            size_t left = p->idrain < DRAIN_BYTES ? p->idrain : DRAIN_BYTES;
            r = recv(p->fd, g->drain, left, MSG_DONTWAIT);
        }
        if (r < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                return moved;
            g->err_peer = q;
            return -E_LOST;
        }
        if (r == 0) { /* the end of its stream, without a CLOSE frame */
            g->err_peer = q;
            return -E_LOST;
        }
        moved = 1;
        if (p->istage == 0) {
            p->ihgot += (size_t)r;
            if (p->ihgot < sizeof(thdr_t))
                continue;
            p->ihgot = 0;
            uint32_t kind = p->ih.kind;
            if ((kind & 0xffffff00u) != MAGIC)
                return -read_abort(g, q);
            kind &= 0xff;
            if (kind == K_STALL) {
                p->told = 1 + p->ih.code;
                continue;
            }
            if (kind == K_CLOSE) {
                g->err_peer = q;
                return -E_CLOSED;
            }
            if (kind == K_FAIL)
                return -peer_failed(g, q);
            if (kind == K_DONE) { /* it read this rank's payload (after its DATA frame of the
                                    * phase, if its call sends one: a mismatched one may not) */
                if (!p->idone) {
                    g->err_peer = q;
                    return -E_LOST; /* (a stream out of step: not this engine's order) */
                }
                ND_SET(p->idone, 0);
                if (!p->irecv)
                    return 1;
                continue;
            }
            p->told = 0; /* its next op began: past what it told */
            int byaddr = p->ih.addr != 0;
            if (!p->irecv) { /* a frame where only its DONE was due: another call's (a mismatch) */
                if (!*mm) {
                    g->err_peer = q;
                    memcpy(&g->err_theirs, &p->ih, sizeof p->ih);
                    g->err_sends = g->err_wants = -1;
                }
                *mm = 1;
                g->keep = 0;
                p->istage = 2;
            } else if (!*mm && check_data(g, q, s) == E_MISMATCH) {
                *mm = 1;
                g->keep = keeps(g, q, s);
                p->istage = 2;
            } else if (*mm) {
                g->keep = g->keep && keeps(g, q, s);
                p->istage = p->ih.nbytes != p->ilen || byaddr ? 2 : 1; /* (a second mismatch: drained too) */
            } else
                p->istage = 1;
            p->idrain = byaddr ? 0 : p->ih.nbytes; /* (by address: nothing follows on the stream) */
            if (byaddr) {
                if (p->istage == 1) { /* read straight into the destination */
                    int err = p->rpid > 0 ? cma_read(p->rpid, p->iptr, p->ih.addr, p->ilen) : EPERM;
                    if (err) { /* it died, or its memory is gone: the link is lost */
                        g->err_peer = q;
                        return -E_LOST;
                    }
                    g->cma_blocks++;
                }
                queue_done(g, p); /* (a drained one too: the sender waits for it) */
                ND_SET(p->irecv, 0);
                p->istage = 0;
                return 1;
            }
            if ((p->istage == 1 && p->ilen == 0) || (p->istage == 2 && p->idrain == 0)) {
                ND_SET(p->irecv, 0);
                p->istage = 0;
                return 1;
            }
            continue;
        }
        if (p->istage == 1) {
            p->igot += (size_t)r;
            if (p->igot < p->ilen)
                continue;
        } else {
            p->idrain -= (size_t)r;
            if (p->idrain)
                continue;
        }
        ND_SET(p->irecv, 0);
        p->istage = 0; /* (a DONE may follow) */
        return 1;
    }
}

/* A peer this rank does not read from now (nothing in this phase, or its frame came): looked
 * at (MSG_PEEK) while the phase waits (and by ``nd_tcp_news``, between ops). A FAIL frame at
 * the head of its stream fails the op (the group is broken: a member that fails in a phase may
 * leave this rank waiting on another); a CLOSE frame or the end of its stream does too when
 * this rank still sends to it (it reads no more). STALL frames are taken as they come. A DATA
 * frame of this op from a rank outside the view, or to this rank outside it, is a mismatch;
 * any other frame is a later op's, left for it.
 * E_OK, or the error. */
static int peek_end(TGroup *g, int q)
{
    Peer *p = &g->peers[q];
    for (;;) {
        ssize_t r = recv(p->fd, &p->ih, sizeof(thdr_t), MSG_PEEK | MSG_DONTWAIT);
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return E_OK;
        if (r <= 0) { /* its stream ended (or failed) */
            if (!p->osend && !p->dsend)
                return E_OK;
            g->err_peer = q;
            return E_LOST;
        }
        if (r < (ssize_t)sizeof(thdr_t))
            return E_OK;
        uint32_t kind = p->ih.kind & 0xff;
        const unsigned char *b = (const unsigned char *)&p->ih;
        int theirs = (p->ih.kind & 0xffffff00u) == MAGIC;
        if (!theirs && !(b[0] == 0x44 && b[1] == 0x4E && b[2] == PY_ABORT))
            return E_OK; /* (not a frame: the read that reaches it fails) */
        if (theirs && kind == K_DATA && p->ih.seq == g->seq && (g->vrank < 0 || !in_view(g, q))) {
            /* this op's frame from a rank outside the view, or to this rank outside it: the
             * sender runs the op on the whole group where this rank runs it among the view
             * (native/_twolevel.py: a call whose size lies on the other side of the two-level
             * minimum). A later op's frame has a higher seq; in an op run among the view, no
             * frame of it comes from or goes to a rank outside. */
            g->err_peer = q;
            memcpy(&g->err_theirs, &p->ih, sizeof p->ih);
            g->err_sends = g->err_wants = -1;
            g->keep = 0;
            return E_MISMATCH;
        }
        if (theirs && (kind == K_DATA || kind == K_DONE || (kind == K_CLOSE && !p->osend && !p->dsend)))
            return E_OK;
        if (recv(p->fd, &p->ih, sizeof(thdr_t), MSG_DONTWAIT) != (ssize_t)sizeof(thdr_t))
            return E_OK; /* (cannot be: peeked whole) */
        if (!theirs)
            return read_abort(g, q);
        if (kind == K_STALL) {
            p->told = 1 + p->ih.code;
            continue;
        }
        g->err_peer = q;
        return kind == K_CLOSE ? E_CLOSED : peer_failed(g, q);
    }
}

/* Send one 64-byte header on a stream at a frame boundary, waiting for room until ``until``
 * (a now_s() time); the bytes sent: sizeof *h, or fewer when the stream failed or the time ran
 * out. The caller decides what a header cut short means for its stream. */
static size_t send_header(int fd, const thdr_t *h, double until)
{
    size_t off = 0;
    while (off < sizeof *h) {
        ssize_t w = send(fd, (const char *)h + off, sizeof *h - off, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w > 0) {
            off += (size_t)w;
            continue;
        }
        if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            break;
        double left = until - now_s();
        if (left <= 0)
            break;
        struct pollfd pf = {fd, POLLOUT, 0};
        poll(&pf, 1, (int)(left * 1e3) + 1);
    }
    return off;
}

/* Send a STALL frame naming ``code`` to every peer whose outgoing stream is at a frame
 * boundary (the frame of this phase not begun), waiting at most FINAL_FRAME_S for room; a
 * notice cut short ends that stream (nothing more can follow it) and breaks the group. */
static void notice_peers(TGroup *g, int32_t code)
{
    double until = now_s() + FINAL_FRAME_S;
    for (int q = 0; q < g->size; q++) {
        Peer *p = &g->peers[q];
        if (q == g->rank || p->out_done || mid_frame(p))
            continue;
        thdr_t h;
        memset(&h, 0, sizeof h);
        h.kind = MAGIC | K_STALL;
        h.code = code;
        size_t off = send_header(p->fd, &h, until);
        if (off && off < sizeof h) {
            shutdown(p->fd, SHUT_WR);
            p->out_done = 1;
            ND_SET(p->osend, 0);
            g->broken = 1;
        }
    }
}

/* This rank's deadline passed waiting on ``code`` (a group rank, or STALL_GLOBAL + a global
 * rank): its peers are told, then the process's other groups (on_deadline, with the GIL). */
static void post_notice(TGroup *g, int32_t code, PyThreadState **save)
{
    g->posted = 1 + code;
    notice_peers(g, code);
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

/* The rank peer q told it waits on (its STALL notice), or -1: a group rank other than this
 * one, or STALL_GLOBAL + a global rank; *final: q raised naming it. */
static int peer_root(TGroup *g, int q, int *final)
{
    int32_t told = q >= 0 ? g->peers[q].told : 0;
    *final = 0;
    if (!told)
        return -1;
    int r = told - 1;
    if (r & STALL_FINAL) {
        *final = 1;
        r &= ~STALL_FINAL;
    }
    if (r >= STALL_GLOBAL)
        return r;
    return r >= 0 && r < g->size && r != g->rank ? r : -1;
}

/* the first peer this rank still waits on (a receive, else a send), or -1 */
static int waited_peer(TGroup *g)
{
    for (int q = 0; q < g->size; q++)
        if (g->peers[q].irecv || g->peers[q].idone)
            return q;
    for (int q = 0; q < g->size; q++)
        if (g->peers[q].osend || g->peers[q].dsend)
            return q;
    return -1;
}

/* Run the phase set up by set_send / set_recv to its end. A wait (no progress) spins, yields,
 * then polls; progress starts the next wait afresh (``arm``); a wait that polled (from
 * ``slept_at``) teaches the spin when progress ends it. */
static int xchg(TGroup *g, const TSig *s, double deadline, PyThreadState **save)
{
    int n = g->size, mm = 0, arm = 1;
    double t = 0, spin_until = 0, yield_until = 0, slept_at = 0;
    struct pollfd *pf = alloca((size_t)(n + 1) * sizeof(struct pollfd));
    for (;;) {
        int pending = 0, moved = 0;
        for (int q = 0; q < n; q++) {
            Peer *p = &g->peers[q];
            if (p->osend || p->dsend) {
                int r = try_send(p);
                if (r < 0) {
                    g->err_peer = q;
                    return E_LOST;
                }
                moved |= r;
            }
            if (p->irecv || p->idone) {
                int r = try_recv(g, q, s, &mm);
                if (r < 0)
                    return -r;
                moved |= r;
            }
            pending |= p->osend | p->irecv | p->idone | p->dsend;
        }
        if (moved && slept_at > 0) {
            spin_learn(&g->spin_now_us, g->spin_us, slept_at);
            slept_at = 0;
        }
        if (!pending) {
            if (mm && g->keep) { /* (every peer's op ends with this phase: this rank's too?) */
                for (int q = 0; q < n && g->keep; q++)
                    if (q != g->rank)
                        g->keep = last_full_phase(s->op, s->phase, g->peers[q].olen, s->sig);
            }
            return mm ? E_MISMATCH : E_OK;
        }
        if (atomic_load(&g->want_fail)) {
            g->err_cause = atomic_load(&g->fail_cause);
            return E_SELF_FAILED;
        }
        if (atomic_load(&g->want_close)) {
            g->err_peer = g->rank;
            return E_SELF_CLOSED;
        }
        if (moved) {
            arm = 1;
            continue;
        }
        t = now_s();
        if (arm) {
            arm = 0;
            spin_until = t + g->spin_now_us * 1e-6;
            yield_until = spin_until + YIELD_S;
        }
        if (t < spin_until) {
            for (int i = 0; i < 32; i++)
                cpu_relax();
            continue;
        }
        if (t < yield_until && t < deadline) {
            sched_yield();
            continue;
        }
        int k = 0;
        for (int q = 0; q < n; q++) {
            Peer *p = &g->peers[q];
            int out = p->osend || p->dsend, in = p->irecv || p->idone;
            if (!out && !in)
                continue;
            pf[k].fd = p->fd;
            pf[k].events = (short)((out ? POLLOUT : 0) | (in ? POLLIN : 0));
            pf[k++].revents = 0;
        }
        pf[k].fd = g->efd;
        pf[k].events = POLLIN;
        pf[k++].revents = 0;
        double left_ms = ((g->in_grace ? g->grace_end : deadline) - t) * 1e3;
        int wait_ms = left_ms < TICK_MS ? (left_ms > 0 ? (int)left_ms + 1 : 0) : TICK_MS;
        if (slept_at == 0)
            slept_at = t;
        int pr = poll(pf, (nfds_t)k, wait_ms);
        if (pr > 0)
            continue; /* (a socket's error or end shows in the next try) */
        t = now_s();
        if (t >= deadline) {
            int q = waited_peer(g), fin;
            g->err_peer = q;
            int r = peer_root(g, q, &fin); /* it told it waits on another rank: the root cause */
            if (r >= 0 && fin) {
                g->err_cause = r;
                return E_STALLED;
            }
            if (!g->in_grace) { /* tell the peers (the root known so far), then give notices a grace */
                g->in_grace = 1;
                g->grace_end = t + (g->timeout * 0.1 < 1.0 ? g->timeout * 0.1 : 1.0);
                if (q >= 0)
                    post_notice(g, r >= 0 ? r : q, save);
            } else if (r >= 0 && r + 1 != g->posted) /* a refined root: tell it too */
                post_notice(g, r, save);
            if (t >= g->grace_end) {
                if (r >= 0) {
                    g->err_cause = r;
                    return E_STALLED;
                }
                return E_TIMEOUT;
            }
        }
        for (int q = 0; q < n; q++) { /* a peer this rank does not read from now: did it fail? */
            if (q == g->rank || g->peers[q].irecv || g->peers[q].idone)
                continue;
            int rc = peek_end(g, q);
            if (rc)
                return rc;
        }
        int on_main = PyThread_get_thread_ident() == main_thread;
        int warn = t >= g->warn_at && g->on_stall;
        if (on_main || warn) {
            PyEval_RestoreThread(*save);
            int bad = on_main ? PyErr_CheckSignals() : 0;
            if (!bad && warn) {
                g->warn_at = t + WARN_EVERY;
                PyObject *res = PyObject_CallFunction(g->on_stall, "iidd", waited_peer(g), 0, t - g->op_start,
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

/* ------------------------------------------------------------------ breaking the group */
/* Send one final frame (FAIL / CLOSE) to every peer whose stream is at a frame boundary,
 * waiting at most FINAL_FRAME_S for room, then shut down this side of every stream. */
static void send_final(TGroup *g, uint32_t kind, int why, int code)
{
    double until = now_s() + FINAL_FRAME_S;
    for (int q = 0; q < g->size; q++) {
        Peer *p = &g->peers[q];
        if (q == g->rank || p->fd < 0 || p->out_done)
            continue;
        if (!mid_frame(p)) { /* at a boundary: the frame goes whole or not at all */
            thdr_t h;
            memset(&h, 0, sizeof h);
            h.kind = MAGIC | kind;
            h.op = g->cur.op;
            h.dtype = g->cur.dtype;
            h.redop = g->cur.redop;
            h.root = g->cur.root;
            h.sig = g->cur.sig;
            h.esize = g->cur.esize;
            h.seq = g->seq;
            h.why = why;
            h.code = code;
            send_header(p->fd, &h, until); /* cut short or not, the stream ends below */
        }
        ND_SET(p->osend, 0), ND_SET(p->dsend, 0);
        shutdown(p->fd, SHUT_WR);
        p->out_done = 1;
    }
}

/* The op failed with ``rc``: the group is broken; peers are told why. */
static void break_group(TGroup *g, int rc)
{
    if (g->broken)
        return;
    g->broken = 1;
    switch (rc) {
    case E_SELF_CLOSED:
        send_final(g, K_CLOSE, 0, 0);
        break;
    case E_MISMATCH:
        send_final(g, K_FAIL, W_MISMATCH, -1);
        break;
    case E_TIMEOUT:
        send_final(g, K_FAIL, W_STALLED, g->err_peer);
        break;
    case E_STALLED:
        send_final(g, K_FAIL, W_STALLED, g->err_cause);
        break;
    case E_FAILED:
        send_final(g, K_FAIL, W_FAILED, g->err_cause >= 0 ? g->err_cause : g->err_peer);
        break;
    case E_SELF_FAILED: /* fail(-2 - code): this rank timed out (elsewhere) waiting on code */
        if (g->err_cause <= -2)
            send_final(g, K_FAIL, W_STALLED, -2 - g->err_cause);
        else
            send_final(g, K_FAIL, W_FAILED, g->err_cause);
        break;
    case E_LOST:
    case E_CLOSED:
        send_final(g, K_FAIL, W_FAILED, g->err_peer);
        break;
    case E_ABORT: /* (the rank it names, by its global rank) */
        send_final(g, K_FAIL, g->abort_stalled ? W_STALLED : W_FAILED,
                   g->abort_rank >= 0 ? STALL_GLOBAL + g->abort_rank : g->err_peer);
        break;
    default: /* a signal, NumPy's fallback raised */
        send_final(g, K_FAIL, W_FAILED, -1);
    }
}

/* ------------------------------------------------------------------ algorithms */
/* The receive scratch of all_reduce, reduce and reduce_scatter ((n - 1) x a part) is kept
 * between ops: up to SCRATCH_KEEP bytes always; a larger one while ops use it. Once
 * SCRATCH_IDLE_OPS completed ops in a row needed at most a quarter of it, it is freed, so one
 * large reduce does not hold (n - 1) times its size for the group's life, while a loop of
 * large reduces does not fault in fresh pages at every call (freeing it after each op made a
 * 128 MiB reduce at n = 2 over TCP on one host ~2x slower). */
#define SCRATCH_KEEP ((size_t)64 << 20)
#define SCRATCH_IDLE_OPS 8

static int grow_scratch(TGroup *g, size_t need)
{
    if (need > g->op_need)
        g->op_need = need;
    if (need <= g->scratch_len)
        return 0;
    free(g->scratch); /* (its bytes are not needed: no realloc copy) */
    g->scratch = malloc(need);
    g->scratch_len = g->scratch != NULL ? need : 0;
    return g->scratch != NULL ? 0 : -1; /* (E_PY: raise_err raises MemoryError) */
}

/* after an op that completed (after a failure a peer's receive state may still point into
 * the scratch, so it stays until a later op completes or the group closes) */
static void trim_scratch(TGroup *g)
{
    if (g->scratch_len <= SCRATCH_KEEP)
        return;
    if (g->op_need > g->scratch_len / 4) {
        g->scratch_idle = 0;
        return;
    }
    if (++g->scratch_idle >= SCRATCH_IDLE_OPS) {
        free(g->scratch);
        g->scratch = NULL;
        g->scratch_len = 0;
        g->scratch_idle = 0;
    }
}

/* dst = x_0 (op) x_1 (op) ... in rank order, x_k = src[k]; dst may be src[0] or src[1], which
 * the first step reads before it writes them (the kernels take an output that is an input,
 * kernels.h; NumPy's fallback too), never a later one. So rank 0 or 1 folds straight into its
 * own buffer; a rank past them folds into the scratch and copies its result back (at n = 2
 * over TCP that copy was rank 1's whole part of every large all_reduce) */
static int fold(TGroup *g, Red *r, char *dst, char **src, size_t count, PyThreadState **save)
{
    int rc = do_reduce(r, dst, src[0], src[1], count, save);
    for (int k = 2; k < g->vsize && rc == E_OK; k++)
        rc = do_reduce(r, dst, dst, src[k], count, save);
    return rc;
}

/* the phase, run; a failure's peer and cause are set by xchg. After a failure the per-peer
 * state stays as it was: break_group must not write a frame into a peer's stream where a
 * frame of this phase was cut short (its payload would take the header's bytes as data). */
static int phase(TGroup *g, TSig *s, double dl, PyThreadState **sv)
{
    g->cur = *s;
    int rc = xchg(g, s, dl, sv);
    if (rc == E_OK)
        clear_phase(g);
    return rc;
}

static int run_all_reduce(TGroup *g, char *buf, size_t nbytes, Red *r, int rsag, double dl, PyThreadState **sv)
{
    int n = g->vsize, me = g->vrank, rc;
    TSig s = {OP_ALL_REDUCE | g->tag, r->dtype, r->redop, -1, nbytes, (uint64_t)r->esize, 0, 1};
    size_t count = nbytes / (size_t)r->esize;
    char **src = alloca((size_t)n * sizeof(char *));
    if (!rsag || count < (size_t)n) {
        if (grow_scratch(g, (size_t)(n - 1) * nbytes + 1))
            return E_PY;
        for (int q = 0, k = 0; q < n; q++) {
            if (q == me) {
                src[q] = buf;
                continue;
            }
            src[q] = g->scratch + (size_t)k++ * nbytes;
            set_send(g, q, &s, buf, nbytes);
            set_recv(g, q, src[q], nbytes);
        }
        if ((rc = phase(g, &s, dl, sv)))
            return rc;
        char *dst = me < 2 ? buf : src[0]; /* (rank 0 or 1 folds in place: see fold) */
        rc = fold(g, r, dst, src, count, sv);
        if (rc == E_OK && dst != buf)
            memcpy(buf, dst, nbytes);
        return rc;
    }
    /* reduce-scatter: part q (count/n elements, the first count%n one more) reduced by rank q */
    size_t es = (size_t)r->esize, base = count / n, extra = count % n;
    size_t *off = alloca((size_t)(n + 1) * sizeof(size_t));
    off[0] = 0;
    for (int q = 0; q < n; q++)
        off[q + 1] = off[q] + (base + ((size_t)q < extra)) * es;
    size_t mine = off[me + 1] - off[me];
    if (grow_scratch(g, (size_t)(n - 1) * mine + 1))
        return E_PY;
    for (int q = 0, k = 0; q < n; q++) {
        if (q == me) {
            src[q] = buf + off[me];
            continue;
        }
        src[q] = g->scratch + (size_t)k++ * mine;
        set_send(g, q, &s, buf + off[q], off[q + 1] - off[q]);
        set_recv(g, q, src[q], mine);
    }
    if ((rc = phase(g, &s, dl, sv)))
        return rc;
    char *dst = me < 2 ? buf + off[me] : src[0];
    if ((rc = fold(g, r, dst, src, mine / es, sv)))
        return rc;
    if (dst != buf + off[me])
        memcpy(buf + off[me], dst, mine);
    /* all-gather of the reduced parts */
    s.phase = 1;
    for (int q = 0; q < n; q++) {
        if (q == me)
            continue;
        set_send(g, q, &s, buf + off[me], mine);
        set_recv(g, q, buf + off[q], off[q + 1] - off[q]);
    }
    return phase(g, &s, dl, sv);
}

static int run_reduce(TGroup *g, char *buf, size_t nbytes, Red *r, int root, double dl, PyThreadState **sv)
{
    int n = g->vsize, me = g->vrank, rc;
    TSig s = {OP_REDUCE | g->tag, r->dtype, r->redop, root, nbytes, (uint64_t)r->esize, 0, 1};
    if (me != root) {
        set_send(g, root, &s, buf, nbytes);
        return phase(g, &s, dl, sv);
    }
    char **src = alloca((size_t)n * sizeof(char *));
    if (grow_scratch(g, (size_t)(n - 1) * nbytes + 1))
        return E_PY;
    for (int q = 0, k = 0; q < n; q++) {
        if (q == me) {
            src[q] = buf;
            continue;
        }
        src[q] = g->scratch + (size_t)k++ * nbytes;
        set_recv(g, q, src[q], nbytes);
    }
    if ((rc = phase(g, &s, dl, sv)))
        return rc;
    char *dst = me < 2 ? buf : src[0];
    rc = fold(g, r, dst, src, nbytes / (size_t)r->esize, sv);
    if (rc == E_OK && dst != buf)
        memcpy(buf, dst, nbytes);
    return rc;
}

static int run_broadcast(TGroup *g, char *buf, size_t nbytes, int dtype, int root, double dl, PyThreadState **sv)
{
    TSig s = {OP_BROADCAST | g->tag, dtype, 0, root, nbytes, 0, 0, 1};
    if (g->vrank == root) {
        for (int q = 0; q < g->vsize; q++)
            if (q != root)
                set_send(g, q, &s, buf, nbytes);
    } else
        set_recv(g, root, buf, nbytes);
    return phase(g, &s, dl, sv);
}

static int run_barrier(TGroup *g, double dl, PyThreadState **sv)
{
    TSig s = {OP_BARRIER | g->tag, 0, 0, -1, 0, 0, 0, 1};
    for (int q = 0; q < g->vsize; q++)
        if (q != g->vrank) {
            set_send(g, q, &s, NULL, 0);
            set_recv(g, q, NULL, 0);
        }
    return phase(g, &s, dl, sv);
}

/* every rank sends ins[q] (or the one ``inp``) to q and receives outs[q] from q; the own part copied */
static int run_exchange(TGroup *g, TSig *s, Held *outs, Held *ins, const char *inp, size_t inlen, double dl,
                        PyThreadState **sv)
{
    int me = g->vrank;
    for (int q = 0; q < g->vsize; q++) {
        if (q == me)
            continue;
        if (ins)
            set_send(g, q, s, ins->ptr[q], (size_t)ins->len[q]);
        else
            set_send(g, q, s, inp, inlen);
        set_recv(g, q, outs->ptr[q], (size_t)outs->len[q]);
    }
    const char *own = ins ? ins->ptr[me] : inp;
    size_t ownlen = ins ? (size_t)ins->len[me] : inlen;
    if (own != outs->ptr[me])
        memmove(outs->ptr[me], own, ownlen < (size_t)outs->len[me] ? ownlen : (size_t)outs->len[me]);
    return phase(g, s, dl, sv);
}

static int run_gather(TGroup *g, Held *outs, const char *inp, size_t inlen, int dtype, int root, double dl,
                      PyThreadState **sv)
{
    TSig s = {OP_GATHER | g->tag, dtype, 0, root, inlen, 0, 0, 0};
    if (g->vrank != root) {
        set_send(g, root, &s, inp, inlen);
        return phase(g, &s, dl, sv);
    }
    for (int q = 0; q < g->vsize; q++)
        if (q != root)
            set_recv(g, q, outs->ptr[q], (size_t)outs->len[q]);
    if (inp != outs->ptr[root])
        memmove(outs->ptr[root], inp, inlen < (size_t)outs->len[root] ? inlen : (size_t)outs->len[root]);
    return phase(g, &s, dl, sv);
}

static int run_scatter(TGroup *g, char *out, size_t outlen, Held *ins, int dtype, int root, double dl,
                       PyThreadState **sv)
{
    TSig s = {OP_SCATTER | g->tag, dtype, 0, root, outlen, 0, 0, 0};
    if (g->vrank != root) {
        set_recv(g, root, out, outlen);
        return phase(g, &s, dl, sv);
    }
    for (int q = 0; q < g->vsize; q++)
        if (q != root)
            set_send(g, q, &s, ins->ptr[q], (size_t)ins->len[q]);
    if (ins->ptr[root] != out)
        memmove(out, ins->ptr[root], outlen < (size_t)ins->len[root] ? outlen : (size_t)ins->len[root]);
    return phase(g, &s, dl, sv);
}

static int run_reduce_scatter(TGroup *g, char *out, size_t outlen, Held *ins, Red *r, double dl, PyThreadState **sv)
{
    int n = g->vsize, me = g->vrank, rc;
    TSig s = {OP_REDUCE_SCATTER | g->tag, r->dtype, r->redop, -1, outlen, (uint64_t)r->esize, 0, 0};
    char **src = alloca((size_t)n * sizeof(char *));
    if (grow_scratch(g, (size_t)(n - 1) * outlen + 1))
        return E_PY;
    for (int q = 0, k = 0; q < n; q++) {
        if (q == me) {
            src[q] = ins->ptr[me];
            continue;
        }
        src[q] = g->scratch + (size_t)k++ * outlen;
        set_send(g, q, &s, ins->ptr[q], (size_t)ins->len[q]);
        set_recv(g, q, src[q], outlen);
    }
    if ((rc = phase(g, &s, dl, sv)))
        return rc;
    if ((size_t)ins->len[me] != outlen) { /* checked by the public layer; never here */
        g->err_peer = me;
        return E_PY;
    }
    return fold(g, r, out, src, outlen / (size_t)r->esize, sv);
}

/* ------------------------------------------------------------------ Python glue */
/* Claim the sockets for an op (fail / close / tell_stalled hold them only briefly). */
static void claim(TGroup *g)
{
    int free_ = 0;
    while (!atomic_compare_exchange_weak(&g->busy, &free_, 1)) {
        free_ = 0;
        sched_yield();
    }
}

/* Release them; a fail() or close() that came meanwhile and found them busy is carried out now. */
static void release(TGroup *g);

static int check_usable(TGroup *g)
{
    if (g->broken) {
        PyErr_SetString(PyExc_RuntimeError, "native group is broken by an earlier failure");
        return -1;
    }
    if (g->vrank < 0) {
        PyErr_Format(PyExc_RuntimeError, "TcpGroup: rank %d is outside the view: it runs no op", g->rank);
        return -1;
    }
    return 0;
}

/* The op failed after this rank sent payloads by address (``idone``): a peer may be about to
 * read one, and the caller reuses its buffers once the call raised. Wait, at most 1 s in all,
 * until each such peer answered DONE, or failed, or its stream ended (its frames before the
 * DONE read and dropped: the group is broken). Called after break_group, so a peer waiting on
 * this rank fails instead of waiting on it. Without the GIL, with the sockets claimed. */
static void await_readers(TGroup *g)
{
    int any = 0;
    for (int q = 0; q < g->size; q++)
        any |= g->peers[q].idone;
    if (!any)
        return;
    int mm = 1; /* (every frame is drained, none compared) */
    double until = now_s() + 1.0;
    for (int q = 0; q < g->size; q++) {
        Peer *p = &g->peers[q];
        while (p->idone) {
            int r = try_recv(g, q, &g->cur, &mm);
            if (r < 0)
                break;
            if (r > 0)
                continue;
            double left = until - now_s();
            if (left <= 0)
                break;
            struct pollfd pf = {p->fd, POLLIN, 0};
            poll(&pf, 1, (int)(left * 1e3) + 1);
        }
        ND_SET(p->idone, 0), ND_SET(p->irecv, 0);
    }
}

/* the exception's arguments for error ``rc`` (as recorded), or NULL with a Python error set */
static PyObject *err_args(TGroup *g, int rc)
{
    int cause = rc == E_FAILED ? (g->err_cause >= 0 ? g->err_cause : g->err_peer)
              : rc == E_STALLED || rc == E_SELF_FAILED ? g->err_cause : g->err_peer;
    thdr_t *h = &g->err_theirs;
    PyObject *detail = rc == E_MISMATCH
        ? Py_BuildValue("(iiiiKKKLLO)", h->op, h->dtype, h->redop, h->root, (unsigned long long)h->sig,
                        (unsigned long long)h->seq, (unsigned long long)h->esize, (long long)g->err_sends,
                        (long long)g->err_wants, Py_None)
        : rc == E_ABORT ? Py_BuildValue("(y#O)", g->abort_body ? g->abort_body : "", (Py_ssize_t)g->abort_len, Py_None)
        : Py_BuildValue("(iiO)", 0, 0, Py_None);
    if (!detail)
        return NULL;
    return Py_BuildValue("(siiN)", E_NAMES[rc], g->err_peer, cause, detail);
}

static PyObject *raise_err(TGroup *g, int rc)
{
    if (rc == E_SELF_FAILED)
        g->err_peer = g->err_cause;
    int broke = !(rc == E_MISMATCH && g->keep); /* (a kept mismatch: every stream at the next op) */
    if (broke)
        break_group(g, rc);
    else
        clear_phase(g);
    /* (its arguments first: await_readers reads on, which may record more) */
    PyObject *args = rc == E_SIGNAL || rc == E_PY ? NULL : err_args(g, rc);
    if (broke) {
        Py_BEGIN_ALLOW_THREADS
        await_readers(g);
        Py_END_ALLOW_THREADS
    }
    release(g);
    if (rc == E_SIGNAL || (rc == E_PY && PyErr_Occurred()))
        return NULL; /* the Python exception is set */
    if (rc == E_PY)
        return PyErr_NoMemory();
    if (args) {
        PyErr_SetObject(Error, args);
        Py_DECREF(args);
    }
    return NULL;
}

static void release(TGroup *g)
{
    atomic_store(&g->busy, 0);
    if (!atomic_load(&g->want_fail) && !atomic_load(&g->want_close))
        return;
    int free_ = 0;
    if (!atomic_compare_exchange_strong(&g->busy, &free_, 1))
        return; /* someone else holds them now and carries it out */
    if (!g->broken) {
        if (atomic_load(&g->want_fail)) {
            g->err_cause = atomic_load(&g->fail_cause);
            break_group(g, E_SELF_FAILED);
        } else
            break_group(g, E_SELF_CLOSED);
    }
    atomic_store(&g->busy, 0);
}

/* An op's start (the Python methods' RUN and the C interface's nd_tcp_run): the sockets
 * claimed, its per-op state reset, its deadline in *dl. Returns E_OK, or the error the op
 * raises without running: a fail() or close() carried out between check_usable and claim, or
 * news found by a wait elsewhere and not raised there. */
static int op_begin(TGroup *g, double *dl)
{
    claim(g);
    g->ops++;
    if (!g->news) { /* (else the error it recorded) */
        g->err_sends = g->err_wants = -1;
        g->err_cause = -1;
    }
    g->in_grace = 0;
    g->posted = 0;
    g->keep = 0;
    g->op_need = 0;
    double start = now_s();
    ND_SET(g->op_start, start);
    g->warn_at = g->warn_after > 0 ? start + g->warn_after : 1e300;
    *dl = start + g->timeout;
    int rc = E_OK;
    if (g->broken && atomic_load(&g->want_fail)) {
        g->err_cause = atomic_load(&g->fail_cause);
        rc = E_SELF_FAILED;
    } else if (g->broken) {
        g->err_peer = g->rank;
        rc = E_SELF_CLOSED;
    } else if (g->news) {
        rc = g->news;
        g->news = 0;
    }
    return rc;
}

#define RUN(call)                                                                                                 \
    do {                                                                                                          \
        double dl;                                                                                                \
        rc = op_begin(g, &dl);                                                                                    \
        PyThreadState *sv_ = PyEval_SaveThread();                                                                 \
        PyThreadState **sv = &sv_;                                                                                \
        if (rc == E_OK && (rc = (call)) == E_OK)                                                                  \
            trim_scratch(g);                                                                                      \
        PyEval_RestoreThread(sv_);                                                                                \
    } while (0)

#define DONE()                                                                                                    \
    do {                                                                                                          \
        if (rc)                                                                                                   \
            return raise_err(g, rc);                                                                              \
        release(g);                                                                                               \
        Py_RETURN_NONE;                                                                                           \
    } while (0)

static PyObject *T_all_reduce(TGroup *g, PyObject *args)
{
    int rsag, rc;
    Red r;
    Py_buffer b;
    if (check_usable(g) || red_args(args, "OiinOp", &r, &b, &rsag) < 0)
        return NULL;
    RUN(g->vsize > 1 ? run_all_reduce(g, b.buf, (size_t)b.len, &r, rsag, dl, sv) : E_OK);
    PyBuffer_Release(&b);
    DONE();
}

static PyObject *T_reduce(TGroup *g, PyObject *args)
{
    int root, rc;
    Red r;
    Py_buffer b;
    if (check_usable(g) || red_args(args, "OiinOi", &r, &b, &root) < 0)
        return NULL;
    RUN(g->vsize > 1 ? run_reduce(g, b.buf, (size_t)b.len, &r, root, dl, sv) : E_OK);
    PyBuffer_Release(&b);
    DONE();
}

static PyObject *T_broadcast(TGroup *g, PyObject *args)
{
    PyObject *o;
    int dtype, root, rc;
    if (!PyArg_ParseTuple(args, "Oii", &o, &dtype, &root) || check_usable(g))
        return NULL;
    Py_buffer b;
    if (get_buf(o, &b, g->vrank != root) < 0) /* the root only reads its buffer */
        return NULL;
    RUN(run_broadcast(g, b.buf, (size_t)b.len, dtype, root, dl, sv));
    PyBuffer_Release(&b);
    DONE();
}

static PyObject *T_barrier(TGroup *g, PyObject *noargs)
{
    int rc;
    if (check_usable(g))
        return NULL;
    RUN(run_barrier(g, dl, sv));
    DONE();
}

static PyObject *T_all_gather(TGroup *g, PyObject *args)
{
    PyObject *outs, *inp;
    int dtype, rc;
    if (!PyArg_ParseTuple(args, "OOi", &outs, &inp, &dtype) || check_usable(g))
        return NULL;
    Held lo;
    Py_buffer b;
    if (held_get(&lo, outs, g->vsize, 1) < 0)
        return NULL;
    if (get_buf(inp, &b, 0) < 0) {
        held_release(&lo);
        return NULL;
    }
    TSig s = {OP_ALL_GATHER | g->tag, dtype, 0, -1, (uint64_t)b.len, 0, 0, 0};
    RUN(run_exchange(g, &s, &lo, NULL, b.buf, (size_t)b.len, dl, sv));
    PyBuffer_Release(&b);
    held_release(&lo);
    DONE();
}

static PyObject *T_gather(TGroup *g, PyObject *args)
{
    PyObject *outs, *inp;
    int dtype, root, rc;
    if (!PyArg_ParseTuple(args, "OOii", &outs, &inp, &dtype, &root) || check_usable(g))
        return NULL;
    Held lo;
    Py_buffer b;
    if (held_get(&lo, g->vrank == root ? outs : Py_None, g->vsize, 1) < 0)
        return NULL;
    if (get_buf(inp, &b, 0) < 0) {
        held_release(&lo);
        return NULL;
    }
    RUN(run_gather(g, &lo, b.buf, (size_t)b.len, dtype, root, dl, sv));
    PyBuffer_Release(&b);
    held_release(&lo);
    DONE();
}

static PyObject *T_scatter(TGroup *g, PyObject *args)
{
    PyObject *out, *ins;
    int dtype, root, rc;
    if (!PyArg_ParseTuple(args, "OOii", &out, &ins, &dtype, &root) || check_usable(g))
        return NULL;
    Held li;
    Py_buffer b;
    if (held_get(&li, g->vrank == root ? ins : Py_None, g->vsize, 0) < 0)
        return NULL;
    if (get_buf(out, &b, 1) < 0) {
        held_release(&li);
        return NULL;
    }
    RUN(run_scatter(g, b.buf, (size_t)b.len, &li, dtype, root, dl, sv));
    PyBuffer_Release(&b);
    held_release(&li);
    DONE();
}

/* all_to_all(outs, ins, dtype[, out_counts, in_counts, esize]): with the counts, outs and ins
 * are one buffer each, cut at them (the uneven single-buffer form) */
static PyObject *T_all_to_all(TGroup *g, PyObject *args)
{
    PyObject *outs, *ins, *oc = NULL, *ic = NULL;
    Py_ssize_t esize = 0;
    int dtype, rc;
    if (!PyArg_ParseTuple(args, "OOi|OOn", &outs, &ins, &dtype, &oc, &ic, &esize) || check_usable(g))
        return NULL;
    if ((oc == NULL) != (ic == NULL)) {
        PyErr_SetString(PyExc_TypeError, "all_to_all: both counts or neither");
        return NULL;
    }
    Held lo, li;
    if (held_get(&lo, oc ? Py_None : outs, g->vsize, 1) < 0)
        return NULL;
    if (held_get(&li, ic ? Py_None : ins, g->vsize, 0) < 0) {
        held_release(&lo);
        return NULL;
    }
    if (oc && (held_cut(&lo, outs, oc, esize, 1) < 0 || held_cut(&li, ins, ic, esize, 0) < 0)) {
        held_release(&lo);
        held_release(&li);
        return NULL;
    }
    TSig s = {OP_ALL_TO_ALL | g->tag, dtype, 0, -1, 0, 0, 0, 0};
    for (int q = 0; q < li.n; q++) /* (the call's input bytes, for a peer's mismatch message: not compared) */
        s.sig += (uint64_t)li.len[q];
    RUN(run_exchange(g, &s, &lo, &li, NULL, 0, dl, sv));
    held_release(&lo);
    held_release(&li);
    DONE();
}

static PyObject *T_reduce_scatter(TGroup *g, PyObject *args)
{
    PyObject *out, *ins, *fb;
    int dtype, redop, rc;
    Py_ssize_t esize;
    Red r;
    if (!PyArg_ParseTuple(args, "OOiinO", &out, &ins, &dtype, &redop, &esize, &fb) || check_usable(g) ||
        red_init(&r, dtype, redop, esize, fb) < 0)
        return NULL;
    Held li;
    Py_buffer b;
    if (held_get(&li, ins, g->vsize, 0) < 0)
        return NULL;
    if (get_buf(out, &b, 1) < 0) {
        held_release(&li);
        return NULL;
    }
    RUN(g->vsize > 1 ? run_reduce_scatter(g, b.buf, (size_t)b.len, &li, &r, dl, sv)
                    : (memmove(b.buf, li.ptr[0], (size_t)b.len), E_OK));
    PyBuffer_Release(&b);
    held_release(&li);
    DONE();
}

/* ------------------------------------------------------------------ the C interface's entry (engines.h) */
void nd_tcp_set_seq(PyObject *o, unsigned long long seq) { ((TGroup *)o)->seq = seq; }

void nd_tcp_geometry(PyObject *o, int *rank, int *size)
{
    *rank = ((TGroup *)o)->rank;
    *size = ((TGroup *)o)->size;
}

/* an op's body among the view (its vsize ranks): list ops' blocks in ``a`` (outputs) and ``b``
 * (inputs), vsize each; a failure keeps the sockets claimed (nd_tcp_raise releases them) */
static int tcp_body(TGroup *g, const NdOp *op, Held *a, Held *b, PyThreadState **sv)
{
    int n = g->vsize, rc;
    Red r = {op->dtype, op->redop, op->esize, op->fallback};
    double dl;
    if ((rc = op_begin(g, &dl)) != E_OK)
        return rc;
    if (op->op == OP_ALL_REDUCE) {
        rc = n > 1 ? run_all_reduce(g, op->out, (size_t)op->outbytes, &r, op->rsag, dl, sv) : E_OK;
    } else if (op->op == OP_REDUCE) {
        rc = n > 1 ? run_reduce(g, op->out, (size_t)op->outbytes, &r, op->root, dl, sv) : E_OK;
    } else if (op->op == OP_BROADCAST) {
        rc = run_broadcast(g, op->out, (size_t)op->outbytes, op->dtype, op->root, dl, sv);
    } else if (op->op == OP_BARRIER) {
        rc = run_barrier(g, dl, sv);
    } else if (op->op == OP_ALL_GATHER) {
        TSig s = {OP_ALL_GATHER | g->tag, op->dtype, 0, -1, (uint64_t)op->inbytes, 0, 0, 0};
        rc = run_exchange(g, &s, a, NULL, op->in, (size_t)op->inbytes, dl, sv);
    } else if (op->op == OP_ALL_TO_ALL) {
        TSig s = {OP_ALL_TO_ALL | g->tag, op->dtype, 0, -1, 0, 0, 0, 0};
        for (int q = 0; q < n; q++) /* (the call's input bytes, for a peer's mismatch message: not compared) */
            s.sig += (uint64_t)b->len[q];
        rc = run_exchange(g, &s, a, b, NULL, 0, dl, sv);
    } else {
        rc = n > 1 ? run_reduce_scatter(g, op->out, (size_t)op->outbytes, b, &r, dl, sv)
                   : (memmove(op->out, op->in, (size_t)op->outbytes), E_OK);
    }
    if (rc == E_OK) {
        trim_scratch(g);
        release(g);
    }
    return rc;
}

/* a list op's blocks: the given ones (``ptr``/``len``, n each), else ``base`` cut at ``counts``
 * (elements of ``esize`` bytes: all_to_all's split sizes), else in n equal ones */
static void blocks(Held *h, char **ptr, Py_ssize_t *len, char **given, Py_ssize_t *glen, const char *base,
                   Py_ssize_t bytes, const Py_ssize_t *counts, Py_ssize_t esize, int n)
{
    h->views = NULL, h->ptr = ptr, h->len = len, h->n = n;
    Py_ssize_t off = 0;
    for (int q = 0; q < n; q++) {
        if (given)
            ptr[q] = given[q], len[q] = glen[q];
        else if (counts)
            ptr[q] = (char *)base + off, len[q] = counts[q] * esize, off += len[q];
        else
            ptr[q] = (char *)base + q * (bytes / n), len[q] = bytes / n;
    }
}

static int tcp_run_in_view(TGroup *g, const NdOp *op, char **outs, Py_ssize_t *olen, char **ins, Py_ssize_t *ilen,
                           PyThreadState **sv)
{
    int n = g->vsize, rc;
    Held a = {NULL, NULL, NULL, n}, b = {NULL, NULL, NULL, n};
    char **ptr = NULL;
    Py_ssize_t *len = NULL;
    if (op->op == OP_ALL_GATHER || op->op == OP_ALL_TO_ALL || op->op == OP_REDUCE_SCATTER) {
        ptr = malloc(2 * (size_t)n * sizeof(char *));
        len = malloc(2 * (size_t)n * sizeof(Py_ssize_t));
        if (!ptr || !len) {
            free(ptr);
            free(len);
            return ND_SHM_NOMEM;
        }
        int cut = op->op == OP_ALL_TO_ALL && op->out_counts; /* split sizes */
        blocks(&a, ptr, len, outs, olen, op->out, op->outbytes, cut ? op->out_counts : NULL, op->esize, n);
        blocks(&b, ptr + n, len + n, ins, ilen, op->in, op->inbytes, cut ? op->in_counts : NULL, op->esize, n);
    }
    rc = tcp_body(g, op, &a, &b, sv);
    free(ptr);
    free(len);
    return rc;
}

int nd_tcp_run(PyObject *o, const NdOp *op, PyThreadState **sv)
{
    TGroup *g = (TGroup *)o;
    if (g->broken || g->vrank < 0 || g->vsize != g->size) /* (a two-level group's TcpGroup: nd_tcp_step) */
        return ND_SHM_BROKEN;
    return tcp_run_in_view(g, op, NULL, NULL, NULL, NULL, sv);
}

int nd_tcp_step(PyObject *o, const NdOp *op, char **outs, Py_ssize_t *olen, char **ins, Py_ssize_t *ilen,
                PyThreadState **sv)
{
    TGroup *g = (TGroup *)o;
    if (g->broken || g->vrank < 0)
        return ND_SHM_BROKEN;
    return tcp_run_in_view(g, op, outs, olen, ins, ilen, sv);
}

void nd_tcp_set_tag(PyObject *o, int tag) { ((TGroup *)o)->tag = tag; }

int nd_tcp_set_view(PyObject *o, const int *map, int k)
{
    TGroup *g = (TGroup *)o;
    int *m = NULL, vrank = -1;
    if (map) {
        if (!(m = malloc((size_t)k * sizeof(int))))
            return -1;
        for (int i = 0; i < k; i++)
            if ((m[i] = map[i]) == g->rank)
                vrank = i;
    }
    free(g->vmap);
    g->vmap = m;
    g->vsize = map ? k : g->size;
    g->vrank = map ? vrank : g->rank;
    return 0;
}

PyObject *nd_tcp_raise(PyObject *o, int rc)
{
    if (rc == ND_SHM_BROKEN) {
        PyErr_SetString(PyExc_RuntimeError, "native group is broken by an earlier failure");
        return NULL;
    }
    if (rc == ND_SHM_NOMEM)
        return PyErr_NoMemory();
    return raise_err((TGroup *)o, rc);
}

/* another thread asks: carried out now when the sockets are free, else by the op holding them */
static void ask(TGroup *g)
{
    uint64_t one = 1;
    ssize_t w = write(g->efd, &one, sizeof one); /* wakes an op waiting in poll */
    (void)w;
    int free_ = 0;
    if (atomic_compare_exchange_strong(&g->busy, &free_, 1))
        release(g);
}

static PyObject *T_close(TGroup *g, PyObject *noargs)
{
    atomic_store(&g->want_close, 1);
    Py_BEGIN_ALLOW_THREADS
    ask(g);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *T_fail(TGroup *g, PyObject *arg)
{
    long cause = PyLong_AsLong(arg);
    if (cause == -1 && PyErr_Occurred())
        return NULL;
    atomic_store(&g->fail_cause, (int)cause);
    atomic_store(&g->want_fail, 1);
    Py_BEGIN_ALLOW_THREADS
    ask(g);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* (ctcp.h) */
int nd_tcp_news(PyObject *o, const NdCall *call)
{
    TGroup *g = (TGroup *)o;
    int free_ = 0;
    if (!atomic_compare_exchange_strong(&g->busy, &free_, 1))
        return 0; /* an op, fail, close or notice holds the sockets: a later look */
    int rc = E_OK;
    if (!g->broken && !g->news) {
        for (int q = 0; q < g->size && !rc; q++)
            if (q != g->rank)
                rc = peek_end(g, q);
        if (rc) {
            g->news = rc;
            g->cur = (TSig){call->op, call->dtype, call->redop, call->root, call->nbytes, call->esize, 0, 0};
        }
    }
    release(g);
    return rc != E_OK;
}

int nd_tcp_is(PyObject *o)
{
    return PyObject_TypeCheck(o, &TGroupType);
}

/* raise_news(): the error a wait elsewhere found (``nd_tcp_news``), after breaking the group
 * (its peers are told, as by an op that failed); None when there is none. */
static PyObject *T_raise_news(TGroup *g, PyObject *noargs)
{
    claim(g);
    int rc = g->news;
    g->news = 0;
    if (!rc) {
        release(g);
        Py_RETURN_NONE;
    }
    return raise_err(g, rc);
}

/* The timeout notice of a wait elsewhere (another group, point to point): this rank, idle
 * here, passed a deadline waiting on ``code``; a peer whose deadline passes waiting on this
 * rank names it (until this rank's next op). Sent only while no op holds the sockets. */
static PyObject *T_tell_stalled(TGroup *g, PyObject *arg)
{
    long code = PyLong_AsLong(arg);
    if (code == -1 && PyErr_Occurred())
        return NULL;
    int free_ = 0;
    if (g->broken || !atomic_compare_exchange_strong(&g->busy, &free_, 1))
        Py_RETURN_NONE;
    Py_BEGIN_ALLOW_THREADS
    notice_peers(g, (int32_t)code);
    Py_END_ALLOW_THREADS
    release(g);
    Py_RETURN_NONE;
}

/* group ranks the running op has not heard from in its phase (for a timeout's message) */
static PyObject *T_waiting(TGroup *g, PyObject *noargs)
{
    PyObject *lst = PyList_New(0);
    for (int q = 0; lst && q < g->size; q++) {
        Peer *p = &g->peers[q];
        if (!ND_GET(p->irecv) && !ND_GET(p->osend) && !ND_GET(p->idone) && !ND_GET(p->dsend))
            continue;
        PyObject *v = PyLong_FromLong(q);
        if (!v || PyList_Append(lst, v) < 0) {
            Py_XDECREF(v);
            Py_CLEAR(lst);
            break;
        }
        Py_DECREF(v);
    }
    return lst;
}

/* the descriptors this group owns, by group rank (-1: this rank) */
static PyObject *T_fds(TGroup *g, PyObject *noargs)
{
    PyObject *lst = PyList_New(g->size);
    for (int q = 0; lst && q < g->size; q++) {
        PyObject *v = PyLong_FromLong(g->peers[q].fd);
        if (!v) {
            Py_CLEAR(lst);
            break;
        }
        PyList_SET_ITEM(lst, q, v);
    }
    return lst;
}

static void T_dealloc(TGroup *g)
{
    if (g->peers)
        for (int q = 0; q < g->size; q++)
            if (g->peers[q].fd >= 0)
                close(g->peers[q].fd);
    if (g->efd >= 0)
        close(g->efd);
    PyMem_Free(g->peers);
    free(g->scratch);
    PyMem_Free(g->drain);
    free(g->abort_body);
    free(g->vmap);
    Py_CLEAR(g->on_stall);
    Py_CLEAR(g->on_deadline);
    Py_TYPE(g)->tp_free((PyObject *)g);
}

/* cma: None, or per group rank None (this rank, or no single copy with it) or (read_pid,
 * they_read): the pid through which this rank reads that peer's memory (0: it does not) and
 * whether the peer reads this rank's (the link's facts, which both ends agreed on) */
static int set_cma(TGroup *g, PyObject *cma)
{
    if (cma == NULL || cma == Py_None)
        return 0;
    PyObject *fast = PySequence_Fast(cma, "cma: expected a list of (read_pid, they_read) or None per rank");
    if (!fast)
        return -1;
    if (PySequence_Fast_GET_SIZE(fast) != g->size) {
        Py_DECREF(fast);
        PyErr_Format(PyExc_ValueError, "cma: expected %d entries", g->size);
        return -1;
    }
    for (int q = 0; q < g->size; q++) {
        PyObject *e = PySequence_Fast_GET_ITEM(fast, q);
        int pid = 0, they = 0;
        if (e != Py_None && (q == g->rank || !PyArg_ParseTuple(e, "ip", &pid, &they))) {
            Py_DECREF(fast);
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "cma[%d]: expected None for this rank", q);
            return -1;
        }
        g->peers[q].rpid = pid > 0 ? pid : 0;
        g->peers[q].they_read = they;
    }
    Py_DECREF(fast);
    return 0;
}

/* TcpGroup(rank, size, fds, timeout, spin_us, cma=None): ``fds`` holds a connected stream
 * socket's descriptor per peer (-1 for this rank); the group owns them from here (it closes
 * them). ``cma``: see set_cma. */
static int T_init(TGroup *g, PyObject *args, PyObject *kw)
{
    static char *kws[] = {"rank", "size", "fds", "timeout", "spin_us", "cma", NULL};
    PyObject *fds, *cma = NULL;
    g->efd = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iiOdd|O", kws, &g->rank, &g->size, &fds, &g->timeout, &g->spin_us,
                                     &cma))
        return -1;
    if (g->size < 1 || g->rank < 0 || g->rank >= g->size || g->timeout <= 0) {
        PyErr_SetString(PyExc_ValueError, "TcpGroup: expected 0 <= rank < size and a timeout > 0");
        return -1;
    }
    g->spin_now_us = g->spin_us;
    g->vsize = g->size;
    g->vrank = g->rank;
    PyObject *fast = PySequence_Fast(fds, "fds: expected a list of descriptors");
    if (!fast)
        return -1;
    if (PySequence_Fast_GET_SIZE(fast) != g->size) {
        Py_DECREF(fast);
        PyErr_Format(PyExc_ValueError, "fds: expected %d descriptors", g->size);
        return -1;
    }
    g->peers = PyMem_Calloc((size_t)g->size, sizeof(Peer));
    g->drain = PyMem_Malloc(DRAIN_BYTES);
    if (!g->peers || !g->drain) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (int q = 0; q < g->size; q++)
        g->peers[q].fd = -1;
    for (int q = 0; q < g->size; q++) {
        long fd = PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, q));
        if (fd == -1 && PyErr_Occurred()) {
            Py_DECREF(fast);
            return -1;
        }
        if ((q == g->rank) != (fd < 0)) {
            Py_DECREF(fast);
            PyErr_Format(PyExc_ValueError, "fds[%d]: expected %s, got %ld", q, q == g->rank ? "-1" : "a descriptor",
                         fd);
            return -1;
        }
        g->peers[q].fd = (int)fd;
    }
    Py_DECREF(fast);
    if (set_cma(g, cma) < 0)
        return -1;
    for (int q = 0; q < g->size; q++) {
        int fd = g->peers[q].fd;
        if (fd < 0)
            continue;
        int fl = fcntl(fd, F_GETFL);
        if (fl >= 0)
            fcntl(fd, F_SETFL, fl | O_NONBLOCK);
        int one = 1; /* (a Unix socket refuses it: harmless) */
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    g->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (g->efd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    return 0;
}

/* view: the ranks the next ops run among (see TGroup), or None for all of them */
static PyObject *T_get_view(TGroup *g, void *closure)
{
    if (!g->vmap)
        Py_RETURN_NONE;
    PyObject *t = PyTuple_New(g->vsize);
    for (int i = 0; t && i < g->vsize; i++) {
        PyObject *v = PyLong_FromLong(g->vmap[i]);
        if (!v) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

static int T_set_view(TGroup *g, PyObject *value, void *closure)
{
    if (atomic_load(&g->busy)) {
        PyErr_SetString(PyExc_RuntimeError, "view: an op is running");
        return -1;
    }
    if (value == NULL || value == Py_None) {
        free(g->vmap);
        g->vmap = NULL;
        g->vsize = g->size;
        g->vrank = g->rank;
        return 0;
    }
    PyObject *fast = PySequence_Fast(value, "view: expected a sequence of group ranks or None");
    if (!fast)
        return -1;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(fast);
    int *map = k > 0 && k <= g->size ? malloc((size_t)k * sizeof(int)) : NULL;
    int vrank = -1;
    if (!map) {
        Py_DECREF(fast);
        PyErr_Format(PyExc_ValueError, "view: expected 1 to %d group ranks, got %zd", g->size, k);
        return -1;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        long r = PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, i));
        if (r == -1 && PyErr_Occurred())
            goto bad;
        if (r < 0 || r >= g->size) {
            PyErr_Format(PyExc_ValueError, "view[%zd]: expected a group rank in [0, %d), got %ld", i, g->size, r);
            goto bad;
        }
        for (Py_ssize_t j = 0; j < i; j++)
            if (map[j] == r) {
                PyErr_Format(PyExc_ValueError, "view[%zd]: group rank %ld is there twice", i, r);
                goto bad;
            }
        map[i] = (int)r;
        if (r == g->rank)
            vrank = (int)i;
    }
    Py_DECREF(fast);
    free(g->vmap);
    g->vmap = map;
    g->vsize = (int)k;
    g->vrank = vrank;
    return 0;
bad:
    Py_DECREF(fast);
    free(map);
    return -1;
}

/* (read while an op runs on another thread, for a waiting op's message: an atomic load) */
static PyObject *T_get_op_start(TGroup *g, void *closure) { return PyFloat_FromDouble(ND_GET(g->op_start)); }

static PyGetSetDef T_getset[] = {
    {"view", (getter)T_get_view, (setter)T_set_view,
     "the group ranks the next ops run among, in their order there (None: all); failures are still watched "
     "and named by group rank. A rank outside it runs no op, and this op's frames must not come to it", NULL},
    {"op_start", (getter)T_get_op_start, NULL,
     "when the latest op began (CLOCK_MONOTONIC seconds, as time.monotonic())", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef T_methods[] = {
    {"all_reduce", (PyCFunction)T_all_reduce, METH_VARARGS,
     "all_reduce(buf, dtype, redop, esize, fallback, rsag): in place, rank-order reduction"},
    {"reduce", (PyCFunction)T_reduce, METH_VARARGS, "reduce(buf, dtype, redop, esize, fallback, root)"},
    {"broadcast", (PyCFunction)T_broadcast, METH_VARARGS, "broadcast(buf, dtype, root)"},
    {"barrier", (PyCFunction)T_barrier, METH_NOARGS, "barrier()"},
    {"all_gather", (PyCFunction)T_all_gather, METH_VARARGS, "all_gather(outs, inp, dtype)"},
    {"gather", (PyCFunction)T_gather, METH_VARARGS, "gather(outs or None, inp, dtype, root)"},
    {"scatter", (PyCFunction)T_scatter, METH_VARARGS, "scatter(out, ins or None, dtype, root)"},
    {"all_to_all", (PyCFunction)T_all_to_all, METH_VARARGS, "all_to_all(outs, ins, dtype[, oc, ic, esize])"},
    {"reduce_scatter", (PyCFunction)T_reduce_scatter, METH_VARARGS,
     "reduce_scatter(out, ins, dtype, redop, esize, fallback)"},
    {"close", (PyCFunction)T_close, METH_NOARGS, "close the group: peers waiting on this rank fail (CLOSE)"},
    {"fail", (PyCFunction)T_fail, METH_O, "fail(cause_rank): break the group naming cause_rank (FAIL to peers)"},
    {"raise_news", (PyCFunction)T_raise_news, METH_NOARGS,
     "raise the failure a wait elsewhere found (a same-host group's watch), breaking this group; None if none"},
    {"tell_stalled", (PyCFunction)T_tell_stalled, METH_O,
     "tell_stalled(code): idle here, this rank timed out elsewhere waiting on code (see STALL_GLOBAL)"},
    {"waiting", (PyCFunction)T_waiting, METH_NOARGS, "group ranks the running op has not heard from"},
    {"fds", (PyCFunction)T_fds, METH_NOARGS, "the socket descriptors it owns, by group rank (-1: this rank)"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef T_members[] = {
    {"seq", T_ULONGLONG, offsetof(TGroup, seq), 0, "sequence number of the next op (goes into its frames)"},
    {"tag", T_INT, offsetof(TGroup, tag), 0,
     "ORed into the op code of the frames this rank sends and expects (above bit 8: the two-level engine's call)"},
    {"ops", T_ULONGLONG, offsetof(TGroup, ops), READONLY, "ops run so far"},
    {"scratch_bytes", T_PYSSIZET, offsetof(TGroup, scratch_len), READONLY,
     "bytes of receive scratch held between ops (above 64 MiB only while ops use it)"},
    {"broken", T_INT, offsetof(TGroup, broken), READONLY, "1 once a failure broke the group (every later op fails)"},
    {"cma_min", T_PYSSIZET, offsetof(TGroup, cma_min), 0,
     "a payload of at least this many bytes (0: none) to a peer that reads this rank's memory goes by address"},
    {"cma_blocks", T_ULONGLONG, offsetof(TGroup, cma_blocks), READONLY,
     "payloads this rank read from a peer's memory (single copy)"},
    {"on_stall", T_OBJECT, offsetof(TGroup, on_stall), 0,
     "on_stall(peer, word, waited_s, left_s), called with the GIL from a wait of warn_after seconds"},
    {"warn_after", T_DOUBLE, offsetof(TGroup, warn_after), 0, "seconds an op waits before on_stall (0: never)"},
    {"timeout", T_DOUBLE, offsetof(TGroup, timeout), READONLY, "an op's timeout in seconds"},
    {"spin_us", T_DOUBLE, offsetof(TGroup, spin_us), READONLY, "how long a wait spins before it yields, at first (µs)"},
    {"spin_now_us", T_DOUBLE, offsetof(TGroup, spin_now_us), READONLY,
     "how long this rank's next wait spins (µs): spin_us, doubled after each poll a peer ended within 2 ms, up to 10 x"},
    {"on_deadline", T_OBJECT, offsetof(TGroup, on_deadline), 0,
     "on_deadline(code), called with the GIL when an op's deadline passes (and when its notice is refined) "
     "naming code: a group rank, or STALL_GLOBAL + a global rank"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject TGroupType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ndist._cnative.TcpGroup",
    .tp_basicsize = sizeof(TGroup),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)T_init,
    .tp_dealloc = (destructor)T_dealloc,
    .tp_methods = T_methods,
    .tp_members = T_members,
    .tp_getset = T_getset,
    .tp_doc = "One rank's side of a group's collectives over TCP streams (see ctcp.c).",
};

int nd_tcp_add(PyObject *m, PyObject *error, unsigned long main_ident)
{
    Error = error;
    main_thread = main_ident;
    if (PyType_Ready(&TGroupType) < 0)
        return -1;
    Py_INCREF(&TGroupType);
    if (PyModule_AddObject(m, "TcpGroup", (PyObject *)&TGroupType) < 0) {
        Py_DECREF(&TGroupType);
        return -1;
    }
    return 0;
}
