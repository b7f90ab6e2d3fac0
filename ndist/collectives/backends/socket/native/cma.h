/* Single-copy reads from a peer's memory (cross-memory attach, ``process_vm_readv``), for
 * the native engine's large all_to_all blocks (cnative.c, ``run_all_to_all``) and the TCP
 * engine's payloads for a peer on this host (ctcp.c, whose pairs agree through the link's
 * facts, probed by the mesh).
 *
 * A rank may read another process's memory only where the kernel permits it (same uid
 * and dumpable, or CAP_SYS_PTRACE; Yama's ptrace_scope may forbid it): every rank probes
 * each peer once (``cma_probe``) and publishes what it can read; a sender sends a block by
 * address only to a rank that said it can read it, otherwise it copies through its slot.
 */
#ifndef NDIST_CMA_H
#define NDIST_CMA_H

#include <errno.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

/* Read ``len`` bytes at ``remote`` in process ``pid`` into ``local``. 0, or the errno of the
 * failure (a short read that makes no progress is EFAULT). */
static inline int cma_read(int32_t pid, char *local, uint64_t remote, size_t len)
{
    while (len) {
        struct iovec l = {local, len}, r = {(void *)(uintptr_t)remote, len};
        ssize_t got = process_vm_readv((pid_t)pid, &l, 1, &r, 1, 0);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            return errno ? errno : EFAULT;
        }
        if (got == 0)
            return EFAULT;
        local += got;
        remote += (uint64_t)got;
        len -= (size_t)got;
    }
    return 0;
}

/* 1 when this process may read ``pid``'s memory: the 8 bytes at ``remote`` hold ``expect``. */
static inline int cma_probe(int32_t pid, uint64_t remote, uint64_t expect)
{
    uint64_t v = 0;
    return remote && cma_read(pid, (char *)&v, remote, sizeof v) == 0 && v == expect;
}

#endif
