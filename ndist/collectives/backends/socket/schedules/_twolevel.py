"""Two-level schedules: a group whose ranks sit on more than one host.

Each host's ranks work among themselves (shared memory, rings) and one rank per
host, its *leader*, crosses the network with the flat algorithms of
``_schedule`` run over the leaders only. Same records as every schedule
(``Round`` of ``Send`` / ``Recv``, ``pre`` / ``post`` copies), so the engines
and the simulator run them unchanged.

The topology is ``topo``: for each group rank, the index of its host, hosts
numbered in order of their lowest rank (``wire._links.topology`` makes it from host ids).
Host ``h``'s ranks in rank order are its *local* ranks; local rank 0 (the
host's lowest rank) is its leader, host ``h``'s leader is leader ``h``. Every
rank derives the same topology from the same published host ids, so every
rank builds matching schedules.

Rounds are global: a schedule is phase 1 (inside hosts), phase 2 (leaders),
phase 3 (inside hosts), each as long as its longest host (or as the leaders'
algorithm), idle rounds where a rank has nothing to do.

* all_reduce: binomial reduce to the leader (relative rank v receives, in
  round k, the partial of v + 2^k and computes ``own op theirs``), the leaders'
  all_reduce (up to ``SMALL_MAX`` bytes recursive doubling in ceil(log2 H)
  rounds, ``_rd_leaders``; above, Rabenseifner on a power-of-two number of
  hosts, else the ring), binomial broadcast of the result from the leader.
  **Reduction order**: host h's partial P_h is its ranks' values combined in
  rank order along the binomial tree, ``x_0 op x_1``,
  ``(x_0 op x_1) op (x_2 op x_3)``, ...; the leaders combine the P_h as
  ``_rd_leaders`` documents (small) or as ``_schedule``'s ring / Rabenseifner
  combine ranks (large); every other rank copies its leader's bytes. Results
  are therefore bit-identical on every rank, and equal from run to run for one
  topology.
* broadcast: binomial among the host representatives (the root on its host,
  the leader elsewhere), then binomial inside every host from it; tickets as in
  the flat tree, so both sides of every edge check the call.
* barrier: zero-byte binomial gather to the leader, dissemination among the
  leaders, zero-byte binomial broadcast back.
* all_gather: binomial gather of each host's blocks to its leader (local rank
  order in ``TMP``), Bruck among the leaders over whole host blocks (``TMP``
  rotated by host: position j is host h + j), binomial broadcast of ``TMP``
  inside each host, then copies from ``TMP`` to the outputs in rank order.
"""

from __future__ import annotations

from . import _flat as S

__all__ = ["OPS", "two_level"]

#: the ops that have a two-level schedule
OPS = S.TWO_LEVEL_OPS


def _hosts(topo) -> list:
    """Each host's ranks, in rank order."""
    out: list = [[] for _ in range(max(topo) + 1)]
    for r, h in enumerate(topo):
        out[h].append(r)
    return out


def _remap(rounds, members, bufs=None) -> list:
    """Rounds written for ranks 0..len(members)-1 with peers renamed to ``members``
    (and buffer ids renamed by ``bufs``)."""
    out = []
    for snd, rcv, pre, post in rounds:
        if bufs:
            snd = tuple(S.Send(members[s.peer], bufs.get(s.buf, s.buf), s.off, s.nbytes) for s in snd)
            rcv = tuple(S.Recv(members[v.peer], bufs.get(v.buf, v.buf), v.off, v.nbytes, v.mode) for v in rcv)
            pre, post = ([c._replace(src=bufs.get(c.src, c.src), dst=bufs.get(c.dst, c.dst)) for c in cs]
                         for cs in (pre, post))
        else:
            snd = tuple(s._replace(peer=members[s.peer]) for s in snd)
            rcv = tuple(v._replace(peer=members[v.peer]) for v in rcv)
        out.append(S.Round(snd, rcv, tuple(pre), tuple(post)))
    return out


def _pad(rounds: list, length: int) -> list:
    return rounds + [S.Round()] * (length - len(rounds))


def _tree_reduce(nb: int, n: int, v: int, buf: int) -> list:
    """Binomial reduce to local rank 0 in place in ``buf``: round k, v with lowest set
    bit k sends to v - 2^k, which computes ``own op theirs``. No tickets (every rank
    hears from its leader afterwards)."""
    rounds = []
    for k in range(S._log2(n)):
        m = 1 << k
        if v & m and not v & (m - 1):
            rounds.append(S.Round((S.Send(v - m, buf, 0, nb),), ()))
        elif not v & (2 * m - 1) and v + m < n:
            rounds.append(S.Round((), (S.Recv(v + m, buf, 0, nb, S.REDUCE),)))
        else:
            rounds.append(S.Round())
    return rounds


def _tree_bcast(nb: int, n: int, v: int, buf: int) -> list:
    """Binomial broadcast from local rank 0, no tickets."""
    rounds = []
    for k in range(S._log2(n)):
        m = 1 << k
        if v < m and v + m < n:
            rounds.append(S.Round((S.Send(v + m, buf, 0, nb),), ()))
        elif m <= v < 2 * m:
            rounds.append(S.Round((), (S.Recv(v - m, buf, 0, nb, S.COPY),)))
        else:
            rounds.append(S.Round())
    return rounds


def _rd_leaders(nb: int, n: int, r: int) -> list:
    """Recursive doubling among ``n`` leaders in ceil(log2 n) rounds, a non-power of two
    included: with p = 2^floor(log2 n), leaders p.. ("extras") send their value in
    round 0 to both ranks of pair i mod p/2 (2i, 2i + 1), which compute
    ``((v_2i op v_2i+1) op x_e1) op x_e2 ...`` (extras in rank order) on both sides;
    the doubling goes on among the p core ranks; a last round hands the result from
    the pair's lower rank to its extras. Each message a rank receives in a round is
    reduced in list order after all arrived, so both sides compute the same bits."""
    p = 1 << (n.bit_length() - 1)
    half = p // 2
    extras = {j: [e for e in range(p, n) if (e - p) % half == j] for j in range(half)} if n > p else {}
    rounds = []
    if r >= p:
        j = (r - p) % half
        rounds.append(S.Round((S.Send(2 * j, S.BUF, 0, nb), S.Send(2 * j + 1, S.BUF, 0, nb)), ()))
        rounds += [S.Round()] * (p.bit_length() - 2)
        rounds.append(S.Round((), (S.Recv(2 * j, S.BUF, 0, nb, S.COPY),)))
        return rounds
    mask = 1
    while mask < p:
        q = r ^ mask
        recvs = [S.Recv(q, S.BUF, 0, nb, S.REDUCE if r < q else S.REDUCE_REV)]
        if mask == 1:
            recvs += [S.Recv(e, S.BUF, 0, nb, S.REDUCE) for e in extras.get(r // 2, ())]
        rounds.append(S.Round((S.Send(q, S.BUF, 0, nb),), tuple(recvs)))
        mask <<= 1
    if n > p:
        mine = extras[r // 2] if r % 2 == 0 else []
        rounds.append(S.Round(tuple(S.Send(e, S.BUF, 0, nb) for e in mine), ()))
    return rounds


def _local_depth(hosts) -> int:
    return max(S._log2(len(h)) for h in hosts)


def _merge(copies) -> tuple:
    """Join copies that continue each other on both sides."""
    out: list = []
    for c in copies:
        if not c.nbytes:
            continue
        if out:
            p = out[-1]
            if p.src == c.src and p.dst == c.dst and p.src_off + p.nbytes == c.src_off \
                    and p.dst_off + p.nbytes == c.dst_off:
                out[-1] = p._replace(nbytes=p.nbytes + c.nbytes)
                continue
        out.append(c)
    return tuple(out)


def two_level(op: str, item: int, sizes: tuple, n: int, rank: int, root: int, topo: tuple) -> S.Schedule:
    """This rank's two-level schedule of ``op`` (arguments as ``_schedule.schedule``)."""
    if len(topo) != n:
        raise ValueError(f"topo: expected one host index per rank ({n}), got {len(topo)}")
    hosts = _hosts(topo)
    nh = len(hosts)
    me = topo[rank]
    local = hosts[me]
    v = local.index(rank)
    leaders = [h[0] for h in hosts]
    d1 = _local_depth(hosts)
    if op == "all_reduce":
        nb = sizes[0] * item
        up = _pad(_remap(_tree_reduce(nb, len(local), v, S.BUF), local), d1)
        algo = S.choose("all_reduce", nb, nh, sizes[0], force="sched")
        if algo == "recursive_doubling":
            cross_len = S._log2(nh)
            cross = _remap(_rd_leaders(nb, nh, me), leaders) if v == 0 else []
        else:
            cross_len = len(S.schedule("all_reduce", algo, item, sizes, nh, 0).rounds)
            cross = _remap(S.schedule("all_reduce", algo, item, sizes, nh, me).rounds, leaders) if v == 0 else []
        down = _pad(_remap(_tree_bcast(nb, len(local), v, S.BUF), local), d1)
        return S.Schedule(f"two_level/{algo}", tuple(up + _pad(cross, cross_len) + down))
    if op == "barrier":
        up = _pad(_remap(_tree_reduce(0, len(local), v, S.BUF), local), d1)
        cross_len = S._log2(nh)
        cross = _remap(S.schedule("barrier", "dissemination", 1, (), nh, me).rounds, leaders) if v == 0 else []
        down = _pad(_remap(_tree_bcast(0, len(local), v, S.BUF), local), d1)
        return S.Schedule("two_level/dissemination", tuple(up + _pad(cross, cross_len) + down))
    if op == "broadcast":
        nb = sizes[0] * item
        hr = topo[root]
        reps = [root if h == hr else hosts[h][0] for h in range(nh)]
        cross = []
        if rank == reps[me]:
            cross = _remap(S.schedule("broadcast", "binomial", 1, (nb,), nh, me, hr).rounds, reps)
        rv = local.index(reps[me])
        down = _remap(S.schedule("broadcast", "binomial", 1, (nb,), len(local), v, rv).rounds, local)
        return S.Schedule("two_level/binomial", tuple(_pad(cross, S._log2(nh)) + _pad(down, d1)))
    if op == "all_gather":
        return _all_gather(sizes, item, hosts, me, v, d1)
    raise ValueError(f"op: expected one of {OPS} for a two-level schedule, got {op!r}")


def _all_gather(sizes: tuple, item: int, hosts: list, me: int, v: int, d1: int) -> S.Schedule:
    nh = len(hosts)
    local = hosts[me]
    total = sum(sizes) * item
    lsz = tuple(sizes[q] for q in local)
    g = S.schedule("gather", "binomial", item, lsz, len(local), v, 0)
    # phase 1: the host's blocks to the leader, TMP[0:host bytes] in local rank order
    pre = g.pre if g.pre or v else (S.Copy(S.INP, 0, S.TMP, 0, lsz[v] * item),)  # (a one-rank host)
    up = _pad(_remap(g.rounds, local, {S.BUF: S.TMP}), d1)  # (its tickets name BUF)
    # phase 2: Bruck over whole host blocks (TMP rotated by host)
    htot = tuple(sum(sizes[q] for q in h) * item for h in hosts)
    cross_len = S._log2(nh)
    cross = []
    if v == 0:
        cross = _remap(S.schedule("all_gather", "bruck", 1, htot, nh, me).rounds, [h[0] for h in hosts])
    # phase 3: the whole TMP to the host's ranks
    down = _pad(_remap(_tree_bcast(total, len(local), v, S.TMP), local), d1)
    bb = S._bounds(sizes, item)
    post, pos = [], 0
    for j in range(nh):
        for q in hosts[(me + j) % nh]:
            post.append(S.Copy(S.TMP, pos, S.OUTS, bb[q], sizes[q] * item))
            pos += sizes[q] * item
    post.sort(key=lambda c: c.dst_off)
    return S.Schedule("two_level/bruck", tuple(up + _pad(cross, cross_len) + down), pre, _merge(post),
                      max(total, g.tmp))
