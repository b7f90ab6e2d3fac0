/* The native engine over TCP (ctcp.c): its type, added to the ``_cnative`` module. */
#ifndef NDIST_NATIVE_CTCP_H
#define NDIST_NATIVE_CTCP_H

#include <Python.h>

/* add ``TcpGroup`` to module ``m``; it raises ``error`` (``_cnative.Error``) and checks
 * signals when it runs on ``main_ident``'s thread. 0, or -1 with a Python error set. */
int nd_tcp_add(PyObject *m, PyObject *error, unsigned long main_ident);

#endif
