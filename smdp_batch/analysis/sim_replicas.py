"""The simulator's Ray Serve loops (numba): c replicas, each with its own ``@serve.batch`` queue, behind Ray's
power-of-two-choices router.

* :func:`_replicas_kernel` — each batch's end is known when it closes (replicas that do not slow each other);
* :func:`_replicas_contention_kernel` — replicas on one device that slow each other down
  (:mod:`smdp_batch.specs.contention`): while k replicas run a batch each progresses at 1/s_k, so ends are
  found event by event (closing timeouts and batch ends in time order).

Both draw each batch's time when it closes, so with every s_k = 1 the second gives the first's response times.
:mod:`.simulate` draws the inputs and summarises.
"""

from __future__ import annotations

import numpy as np

from ..kernel_cache import njit  # numba's njit, its cache keyed by every kernel file
from .sim_kernels import _book, _duration


@njit(cache=True, inline="always")
def _route(j, t, pick, assigned, completed, open_n, open_t, members):
    """Request j, arriving at t (ms), goes to the replica of fewer ongoing requests (assigned, not completed)
    among its two picks (a tie: the first), as Ray's ``PowerOfTwoChoicesRequestRouter`` does, and joins that
    replica's open batch (opening it at t).  Returns the replica."""
    a = pick[j, 0]
    b = pick[j, 1]
    r = a
    if assigned[b] - completed[b] < assigned[a] - completed[a]:
        r = b
    assigned[r] += 1
    if open_n[r] == 0:
        open_t[r] = t
    members[r, open_n[r]] = j
    open_n[r] += 1
    return r


@njit(cache=True)
def _close_batch(r, close, open_n, members, last_done, q_done, q_size, q_start, q_tail, arr, pad, lat_of, en_of, det,
                 pool_of, unit, ptr, resp, bounds, genergy, sizes_hist, qhist, q_head):
    """Close replica r's open batch at ``close`` (ms): it starts when the replica's batch ahead is done."""
    size = open_n[r]
    s_exec = pad[size]
    start = max(close, last_done[r])
    done = start + _duration(s_exec, lat_of, det, pool_of, unit, ptr)
    last_done[r] = done
    share = en_of[s_exec] / size
    for m in range(size):
        _book(members[r, m], done, share, arr, resp, bounds, genergy)
    sizes_hist[s_exec] += 1
    waiting = size
    for k in range(q_head[r], q_tail[r]):
        if q_start[r, k] > close:
            waiting += q_size[r, k]
    qhist[min(waiting, qhist.size - 1)] += 1
    q_done[r, q_tail[r]] = done
    q_size[r, q_tail[r]] = size
    q_start[r, q_tail[r]] = start
    q_tail[r] += 1
    open_n[r] = 0


@njit(cache=True)
def _room(q_done, q_size, q_start, q_head, q_tail):
    """Make room in the replicas' queues of closed batches: drop what is known done; double if still full."""
    c, cap = q_done.shape
    live = 0
    for r in range(c):
        live = max(live, q_tail[r] - q_head[r])
    new_cap = cap * 2 if live > cap // 2 else cap
    d = np.empty((c, new_cap))
    z = np.empty((c, new_cap), dtype=np.int64)
    st = np.empty((c, new_cap))
    for r in range(c):
        n = q_tail[r] - q_head[r]
        d[r, :n] = q_done[r, q_head[r]:q_tail[r]]
        z[r, :n] = q_size[r, q_head[r]:q_tail[r]]
        st[r, :n] = q_start[r, q_head[r]:q_tail[r]]
        q_head[r] = 0
        q_tail[r] = n
    return d, z, st


@njit(cache=True, nogil=True)  # the SLO search runs rule families on threads
def _replicas_kernel(arr, maxb, delay, pad, lat_of, en_of, det, pool_of, unit, ptr, resp, bounds, genergy,
                     sizes_hist, qhist, pick, c):
    """Ray Serve with c replicas behind its router (one call serves the whole stream).

    Each arrival goes to one of two distinct replicas drawn at random (``pick[j]``, the ordered pair; c = 2:
    both, in random order), the one with fewer ongoing requests (assigned and not completed; a tie goes to
    the first), as Ray's ``PowerOfTwoChoicesRequestRouter`` does.  Each replica runs ``@serve.batch`` as mode
    2 of :func:`_kernel` does: a batch opens at its first request and holds the requests routed to it up to
    ``delay`` ms later, at most ``maxb``; closed batches run FIFO, one at a time.  ``qhist`` counts, when a
    batch closes, the requests of that replica's closed batches not yet started (this one included).
    Returns the number of batches.
    """
    n_req = arr.size
    cap = 64  # grows (doubling) when a replica has that many closed batches not yet done
    open_t = np.zeros(c)  # the open batch's first arrival (ms), when open_n > 0
    open_n = np.zeros(c, dtype=np.int64)
    members = np.empty((c, maxb), dtype=np.int64)
    last_done = np.zeros(c)
    assigned = np.zeros(c, dtype=np.int64)
    completed = np.zeros(c, dtype=np.int64)
    q_done = np.empty((c, cap))  # per replica, its closed batches in order: done, size, start
    q_size = np.empty((c, cap), dtype=np.int64)
    q_start = np.empty((c, cap))
    q_head = np.zeros(c, dtype=np.int64)  # the first not yet known to be done
    q_tail = np.zeros(c, dtype=np.int64)
    batches = 0
    for j in range(n_req + 1):
        t = arr[j] if j < n_req else np.inf
        for r in range(c):
            if open_n[r] > 0 and open_t[r] + delay < t:  # its timeout passed before t
                if q_tail[r] == q_done.shape[1]:
                    q_done, q_size, q_start = _room(q_done, q_size, q_start, q_head, q_tail)
                _close_batch(r, open_t[r] + delay, open_n, members, last_done, q_done, q_size, q_start, q_tail, arr,
                             pad, lat_of, en_of, det, pool_of, unit, ptr, resp, bounds, genergy, sizes_hist, qhist,
                             q_head)
                batches += 1
            while q_head[r] < q_tail[r] and q_done[r, q_head[r]] <= t:
                completed[r] += q_size[r, q_head[r]]
                q_head[r] += 1
        if j == n_req:
            break
        r = _route(j, t, pick, assigned, completed, open_n, open_t, members)
        if open_n[r] == maxb:  # full: it closes now
            if q_tail[r] == q_done.shape[1]:
                q_done, q_size, q_start = _room(q_done, q_size, q_start, q_head, q_tail)
            _close_batch(r, t, open_n, members, last_done, q_done, q_size, q_start, q_tail, arr, pad, lat_of, en_of,
                         det, pool_of, unit, ptr, resp, bounds, genergy, sizes_hist, qhist, q_head)
            batches += 1
    return batches


@njit(cache=True)
def _rep_close(r, close, open_n, members, pad, lat_of, det, pool_of, unit, ptr, sizes_hist, qhist, flat, b_off,
               b_size, b_exec, b_work, nxt_in_q, q_first, q_last, q_req, run_id, rem, nb, pos):
    """Contention: close replica r's open batch at ``close`` (the clock): it runs now if r is idle, else it
    queues behind r's closed batches.  Returns (batches, requests) closed so far."""
    size = open_n[r]
    s_exec = pad[size]
    b_off[nb] = pos
    for m in range(size):
        flat[pos + m] = members[r, m]
    b_size[nb] = size
    b_exec[nb] = s_exec
    b_work[nb] = _duration(s_exec, lat_of, det, pool_of, unit, ptr)
    sizes_hist[s_exec] += 1
    qhist[min(size + q_req[r], qhist.size - 1)] += 1  # with the requests of r's closed batches not started
    if run_id[r] < 0:
        run_id[r] = nb
        rem[r] = b_work[nb]
    elif q_last[r] < 0:
        q_first[r] = nb
        q_last[r] = nb
        q_req[r] += size
    else:
        nxt_in_q[q_last[r]] = nb
        q_last[r] = nb
        q_req[r] += size
    open_n[r] = 0
    return nb + 1, pos + size


@njit(cache=True, nogil=True)  # the SLO search runs rule families on threads
def _replicas_contention_kernel(arr, maxb, delay, pad, lat_of, en_of, det, pool_of, unit, ptr, resp, bounds, genergy,
                                sizes_hist, qhist, pick, c, slow, efac, acc):
    """:func:`_replicas_kernel` on replicas that slow each other: while k of them run a batch, each batch
    executed at size e progresses at 1/slow[k, e] and accrues (efac[k, e] − 1)·ζ/l mJ per ms of its work beyond ζ (as
    :func:`~.sim_kernels._advance`).  Events between arrivals (a timeout closing a batch, a batch ending and
    its replica starting the next) are taken in time order.  acc[0] gets the busy replica-ms.  Returns the
    number of batches."""
    n_req = arr.size
    open_t = np.zeros(c)
    open_n = np.zeros(c, dtype=np.int64)
    members = np.empty((c, maxb), dtype=np.int64)
    assigned = np.zeros(c, dtype=np.int64)
    completed = np.zeros(c, dtype=np.int64)
    flat = np.empty(n_req, dtype=np.int64)  # each closed batch's requests, batch after batch
    b_off = np.empty(n_req + 1, dtype=np.int64)
    b_size = np.empty(n_req, dtype=np.int64)
    b_exec = np.empty(n_req, dtype=np.int64)
    b_work = np.empty(n_req)
    nxt_in_q = np.full(n_req, -1, dtype=np.int64)  # per replica, its closed batches not started: a linked list
    q_first = np.full(c, -1, dtype=np.int64)
    q_last = np.full(c, -1, dtype=np.int64)
    q_req = np.zeros(c, dtype=np.int64)  # requests in those batches
    run_id = np.full(c, -1, dtype=np.int64)
    rem = np.zeros(c)
    extra = np.zeros(c)
    nb = 0
    pos = 0
    clock = 0.0
    busy_ms = 0.0
    for j in range(n_req + 1):
        t = arr[j] if j < n_req else np.inf
        while True:  # the events before t, in time order
            td = np.inf
            rd = -1
            for r in range(c):
                if open_n[r] > 0 and open_t[r] + delay < t and open_t[r] + delay < td:
                    td = open_t[r] + delay
                    rd = r
            k = 0
            for r in range(c):
                if run_id[r] >= 0:
                    k += 1
            tc = np.inf
            rc = -1
            if k > 0:
                for r in range(c):
                    if run_id[r] >= 0:
                        end = clock + max(rem[r], 0.0) * slow[k, b_exec[run_id[r]]]
                        if end < tc:
                            tc = end
                            rc = r
            ends = rc >= 0 and tc <= t and tc <= td
            now = tc if ends else (td if rd >= 0 else t)
            if k > 0 and now > clock and now < np.inf:
                for r in range(c):
                    if run_id[r] >= 0:
                        e = b_exec[run_id[r]]
                        w = (now - clock) / slow[k, e]
                        rem[r] -= w
                        extra[r] += (efac[k, e] - 1.0) * en_of[e] / lat_of[e] * w
                busy_ms += (now - clock) * k
            if now > clock and now < np.inf:
                clock = now
            if ends:
                kid = run_id[rc]
                size = b_size[kid]
                share = (en_of[b_exec[kid]] + extra[rc]) / size
                for m in range(b_off[kid], b_off[kid] + size):
                    _book(flat[m], tc, share, arr, resp, bounds, genergy)
                completed[rc] += size
                run_id[rc] = -1
                rem[rc] = 0.0
                extra[rc] = 0.0
                q = q_first[rc]
                if q >= 0:  # the replica's next closed batch starts now
                    q_first[rc] = nxt_in_q[q]
                    if q_first[rc] < 0:
                        q_last[rc] = -1
                    run_id[rc] = q
                    rem[rc] = b_work[q]
                    q_req[rc] -= b_size[q]
            elif rd >= 0:
                nb, pos = _rep_close(rd, td, open_n, members, pad, lat_of, det, pool_of, unit, ptr, sizes_hist, qhist,
                                     flat, b_off, b_size, b_exec, b_work, nxt_in_q, q_first, q_last, q_req, run_id,
                                     rem, nb, pos)
            else:
                break
        if j == n_req:
            break
        r = _route(j, t, pick, assigned, completed, open_n, open_t, members)
        if open_n[r] == maxb:  # full: it closes now
            nb, pos = _rep_close(r, t, open_n, members, pad, lat_of, det, pool_of, unit, ptr, sizes_hist, qhist, flat,
                                 b_off, b_size, b_exec, b_work, nxt_in_q, q_first, q_last, q_req, run_id, rem, nb,
                                 pos)
    acc[0] = busy_ms
    return nb
