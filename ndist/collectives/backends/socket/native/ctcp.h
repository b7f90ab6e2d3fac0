/* The native engine over TCP (ctcp.c): its type, added to the ``_cnative`` module. */
#ifndef NDIST_NATIVE_CTCP_H
#define NDIST_NATIVE_CTCP_H

#include <Python.h>
#include <stdint.h>

/* add ``TcpGroup`` to module ``m``; it raises ``error`` (``_cnative.Error``) and checks
 * signals when it runs on ``main_ident``'s thread. 0, or -1 with a Python error set. */
int nd_tcp_add(PyObject *m, PyObject *error, unsigned long main_ident);

/* whether ``o`` is a TcpGroup */
int nd_tcp_is(PyObject *o);

/* The call a wait elsewhere belongs to (its op code with the two-level tag, dtype, redop, root,
 * bytes, element size): what the FAIL frames of its news name. */
typedef struct {
    int op, dtype, redop, root;
    uint64_t nbytes, esize;
} NdCall;

/* News of TcpGroup ``o`` for a wait elsewhere: the two-level engine's shared-memory steps
 * (native/_twolevel.py), whose wait calls this without the GIL every 100 ms. While no op holds
 * the group's sockets, it looks at the head of every peer's stream without blocking, as an op
 * looks at the peers it does not read from: a peer's FAIL frame or lost notice, or a DATA
 * frame of the current sequence number that this rank's view says no rank sends it (a rank
 * outside the view receives none; none comes from outside it). Returns 1 when it found one:
 * the error is recorded for ``TcpGroup.raise_news`` (which breaks the group, telling its peers
 * as a failed op does, naming ``call``) and no later look finds more; else 0. */
int nd_tcp_news(PyObject *o, const NdCall *call);

#endif
