"""Load driver for the latency and throughput experiments.

Two modes over persistent HTTP/1.1 connections, spread over ``processes`` OS processes
(the "threads" of wrk) so that more than one core sends:

* ``closed`` (asyncio): the paper's wrk set-up. Each connection waits a random 0..D ms,
  sends, waits for the response. Latency = response time of that request.
* ``open``: constant offered rate, free of coordinated omission. Slot ``j`` is
  *scheduled* at ``t0 + j / rate``; slots are dealt round-robin to processes. Each process
  runs one loop on non-blocking sockets (epoll, else poll): it releases every slot that
  is due, sends each at once on an idle keep-alive connection (the request bytes are built
  once), and waits for replies until the next slot is due. Latency is measured from the
  scheduled time, not the actual send, so a stalled server or busy connections show up
  as latency. The driver also records its own send lag (send minus scheduled time), how
  many requests it sent more than 5 ms late (and how many of those had waited for a free
  connection) and how many it never sent; ``schedule_lag_fraction`` = (late + never
  sent) / scheduled.

On a machine shared with busy processes, lateness comes from the kernel scheduler: a
driver process waking for its next slot waits for someone else's time slice. Hence
``slice_us`` (a short EEVDF slice under the normal policy, default) and ``rt_priority``
(SCHED_FIFO, opt-in, needs root or CAP_SYS_NICE).

Latencies are microseconds in an HdrHistogram (1 us .. 1 h, 3 significant digits).
Errors are counted by kind: ``connect``, ``timeout`` (from the send), ``read`` (reset,
bad reply) and ``non2xx``. Throughput is reported for successful and for all responses,
divided by ``measured_duration_s`` (the window, lengthened by replies that arrive after
it; ``throughput_basis`` says so); ``duration_s`` stays the nominal window.

Start-up is judged by conditions, not fixed windows (a loaded machine stretches every
step of it): with ``ready_timeout_s`` the driver first sends single requests until one is
answered 2xx (the target has imported and warmed its function), waiting as long as that
first reply takes, up to the deadline; a target that never answers yields a summary with
``ready: False`` and no window at all. Forked driver processes report that they have
started before the start time ``t0`` is fixed (``start_timeout_s`` bounds that). In
closed mode ``min_requests`` lengthens the window, by at most ``max_extra_s``, until that
many requests were concluded in it. Every summary carries the counters that explain a
point without a success (``attempted``, ``sent``, errors by kind with the last error of
each, warm-up requests, the driver's start lag, ``elapsed_s``); :func:`explain_no_success`
turns them into one sentence.

The package's public interface is this module's names: the spec (:class:`LoadSpec`),
:func:`run_load`, :func:`run_wrk` (with :func:`wrk_available`, :func:`wrk_script`,
:func:`parse_wrk`), the summaries (:func:`summarize`, :func:`latency_txt`,
:func:`counters_text`, :func:`explain_no_success`, :func:`spec_dict`) and the HTTP reply
parser. Inside, by concern: ``spec`` (the spec, slot arithmetic, CPU scheduling), ``conn``
(the per-process loops: :class:`~.conn.ClosedLoop`, :class:`~.conn.OpenLoop`), ``measure``
(histograms), ``report`` (text forms), ``driver`` (the processes); no private name crosses
these modules. Several load clients: ``controller`` (one controller starting N clients at
one instant, each driving 1/N of the rate, their histograms merged; :func:`run_load` hands a
spec with ``clients > 1`` to it) and ``netns`` (a network namespace per client).
"""

from .conn import BadReply, parse_response
from .controller import client_main, merge_client_summaries, run_clients, run_load
from .driver import parse_wrk, run_wrk, wrk_available, wrk_script
from .measure import ERROR_KINDS, HIGHEST_US, LATE_S, LOWEST_US, SIGFIG, merge_histograms, new_hist, summarize
from .netns import ClientNamespaces, NetnsError, netns_unavailable
from .report import counters_text, explain_no_success, latency_txt, load_text, spec_dict
from .spec import CLIENT_ISOLATION, LoadSpec, set_sched_slice

__all__ = [
    "BadReply",
    "CLIENT_ISOLATION",
    "ClientNamespaces",
    "NetnsError",
    "client_main",
    "merge_client_summaries",
    "merge_histograms",
    "netns_unavailable",
    "run_clients",
    "ERROR_KINDS",
    "HIGHEST_US",
    "LATE_S",
    "LOWEST_US",
    "LoadSpec",
    "SIGFIG",
    "counters_text",
    "explain_no_success",
    "latency_txt",
    "load_text",
    "new_hist",
    "parse_response",
    "parse_wrk",
    "run_load",
    "run_wrk",
    "set_sched_slice",
    "spec_dict",
    "summarize",
    "wrk_available",
    "wrk_script",
]
