/* ndist's native engine, called from C or C++ (docs/native.md, "The C interface").
 *
 * The extension module ``ndist.collectives.backends.socket.native._cnative`` exports one table
 * of functions, ``ndist_engine_api``, as the PyCapsule named NDIST_ENGINE_CAPSULE (its
 * attribute ``_C_API``), in the manner of NumPy's C-API. A compiled caller gets it once, with
 * the GIL held:
 *
 *     const ndist_engine_api *api = PyCapsule_Import(NDIST_ENGINE_CAPSULE, 0);
 *     if (api == NULL || api->version != NDIST_ENGINE_API_VERSION) ... (a Python error / too old)
 *
 * and a group's handle once per group from Python (``ndist.collectives.engine_handle(group)``,
 * an int). Every function takes the handle, returns an ``ndist_status`` and, when it is not
 * NDIST_OK, fills ``*err`` (which may be NULL) with what the Python path would raise for the
 * same call: the status, the exception's class name, the rank it names and its message.
 *
 * The functions may be called without the GIL, from any thread, and a call that succeeds takes
 * no GIL: its checks, the claim of the group's lane, its number, its flight-recorder entry and
 * the operation run in C on C11 atomics, as the Python path's repeated call does them, so calls
 * through this table and through ``ndist.distributed`` mix on one group in any order, and a
 * Python thread holding the GIL does not hold a call up. The GIL is taken (PyGILState_Ensure)
 * only: on a thread's first call when the thread has no Python thread state (one is made and
 * kept for the thread); on a dtype's first call on the group; when the call fails (its error is
 * mapped in Python); when an async op was queued on the group meanwhile (its worker is woken);
 * while the engine calls back into Python (a stall's warning, a signal check on the main
 * thread); and for every call the engine's C core does not take (a dtype or reduce op it does
 * not finish in C, no element, a busy, broken or closed group, NDIST_DEBUG=DETAIL), which goes
 * through Python. A caller that holds the GIL may call too: it is released around the op.
 *
 * Buffers are pointers to ``count`` elements of ``dtype`` (contiguous); ``count`` is the
 * per-rank element count named at each function. ``root`` is a rank of the group (0 .. size-1).
 * Find this header with ``ndist.collectives.engine_include_dir()``.
 */
#ifndef NDIST_ENGINE_H
#define NDIST_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NDIST_ENGINE_API_VERSION 1
#define NDIST_ENGINE_CAPSULE "ndist.collectives.backends.socket.native._cnative._C_API"

/* element types: the wire's dtype codes (wire/_frame.py, _DTYPES) */
enum ndist_dtype {
    NDIST_BOOL = 1, NDIST_INT8, NDIST_UINT8, NDIST_INT16, NDIST_UINT16, NDIST_INT32, NDIST_UINT32, NDIST_INT64,
    NDIST_UINT64, NDIST_FLOAT16, NDIST_FLOAT32, NDIST_FLOAT64, NDIST_COMPLEX64, NDIST_COMPLEX128, NDIST_BFLOAT16,
    NDIST_FLOAT8_E4M3FN, NDIST_FLOAT8_E5M2
};

/* reduce ops: ReduceOp's codes (wire/_frame.py, REDOPS); PREMUL_SUM is not offered here. A pair
 * the Python path refuses (BAND on float32, ...) is refused alike (NDIST_E_ARGUMENT). */
enum ndist_redop { NDIST_SUM = 1, NDIST_PRODUCT, NDIST_MIN, NDIST_MAX, NDIST_AVG, NDIST_BAND, NDIST_BOR, NDIST_BXOR };

/* what a call returns; the comment says the exception the Python path raises for it */
enum ndist_status {
    NDIST_OK = 0,        /* the op ran and its result is valid (a failure to wake the group's async worker
                          * after it is not the call's: it goes to sys.unraisablehook, docs/native.md) */
    NDIST_E_ARGUMENT,    /* ValueError / TypeError: nothing was sent or numbered, the group stays usable */
    NDIST_E_PEER_LOST,   /* DistNetworkError (DistRankFailureError once the group is revoked): err->rank */
    NDIST_E_TIMEOUT,     /* DistTimeoutError: the message names the ranks not heard from (err->rank -1, as
                          * the exception has no rank attribute) */
    NDIST_E_MISMATCH,    /* DistMismatchError: the ranks called different collectives */
    NDIST_E_BROKEN,      /* an earlier failure broke the group: err holds that first failure again (its
                          * class, rank and message), as the Python path raises it again */
    NDIST_E_CLOSED,      /* the handle's group was destroyed, or the handle is not one (DistBackendError) */
    NDIST_E_INTERRUPTED, /* a signal's handler raised (KeyboardInterrupt) while the call waited */
    NDIST_E_INTERNAL     /* anything else (MemoryError, ...): err->type and err->message say what */
};

typedef struct ndist_error {
    int status;         /* the ndist_status returned */
    int rank;           /* the global rank the error names (DistNetworkError.rank), else -1 */
    int usable;         /* 1: the group's next call may work (a bad argument, a mismatch or a timeout the
                         * engine kept the group through); 0: every later call fails (NDIST_E_BROKEN) */
    char type[48];      /* the Python exception's class name: "DistNetworkError", "ValueError", ... */
    char message[1024]; /* its message, cut to fit */
} ndist_error;

/* a group's handle: ``ndist.collectives.engine_handle(group)``. It stays valid until the group is
 * destroyed (``destroy_process_group``) or its process exits; after that every call returns
 * NDIST_E_CLOSED (never a crash), as does a value that never was a handle. */
typedef uint64_t ndist_group;

typedef struct ndist_engine_api {
    uint32_t version; /* NDIST_ENGINE_API_VERSION of the module */
    uint32_t size;    /* sizeof(ndist_engine_api) in the module: a function past it is absent */

    /* this rank and the group's size */
    int (*group_info)(ndist_group g, int *rank, int *size, ndist_error *err);
    /* buf: count elements, reduced over the group in place (rank order: bit-identical everywhere) */
    int (*all_reduce)(ndist_group g, void *buf, size_t count, int dtype, int op, ndist_error *err);
    /* buf: count elements, root's copied into every rank's */
    int (*broadcast)(ndist_group g, void *buf, size_t count, int dtype, int root, ndist_error *err);
    /* in: count elements; out: size * count, rank r's in at r * count (in may be out + rank * count) */
    int (*all_gather)(ndist_group g, void *out, const void *in, size_t count, int dtype, ndist_error *err);
    /* in: size * count elements; out: count, the reduction over ranks of their block ``rank`` */
    int (*reduce_scatter)(ndist_group g, void *out, const void *in, size_t count, int dtype, int op,
                          ndist_error *err);
    /* in, out: count elements each (a multiple of size): block r of in goes to rank r, block r of
     * out comes from rank r (all_to_all_single without split sizes) */
    int (*all_to_all)(ndist_group g, void *out, const void *in, size_t count, int dtype, ndist_error *err);
    int (*barrier)(ndist_group g, ndist_error *err);

    /* Appended after the first release (``size`` says whether a module has it: a caller checks
     * ``api->size >= offsetof(ndist_engine_api, all_to_all_v) + sizeof api->all_to_all_v``). */

    /* all_to_all_single with split sizes: in holds in_count elements, size blocks packed in rank
     * order, block q (in_counts[q] elements) going to rank q; out holds out_count elements, block q
     * (out_counts[q]) coming from rank q. Each array has size counts, none negative, summing to
     * in_count / out_count; out_counts[rank] == in_counts[rank]. in and out must not overlap; either
     * may be NULL when its count is 0. */
    int (*all_to_all_v)(ndist_group g, void *out, size_t out_count, const int64_t *out_counts, const void *in,
                        size_t in_count, const int64_t *in_counts, int dtype, ndist_error *err);
} ndist_engine_api;

#ifdef __cplusplus
}
#endif

#endif /* NDIST_ENGINE_H */
