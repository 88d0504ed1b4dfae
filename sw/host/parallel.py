"""Phase-wise data-tensor parallelism on a PE group: the multi-PE program compiler and the
multi-PE functional simulation (paper Sections 5.1, 5.2, Fig. 10; ``docs/parallel.md``).

One MoE layer's expert work for a *PE group* (G PEs joined by one aggregation link, the
:mod:`elmoe3d.sw.golden.agg_link` golden model) is compiled into one command program per PE
(``docs/pe.md``), its ``ld`` words split by source (HOST, HB, EXT), the PEs' HB bank images, the
external-memory transfers of the streamline ring (multicast masks) and the aggregation link's
descriptors (:class:`~elmoe3d.sw.golden.agg_link.LinkOp`):

* **draft** (HB-only tensor parallelism, DRAFT mode, MSB slices only): the up/gate column
  blocks are split across the PEs by output channel (PE p holds the MSB slices and scales of its
  channel slice: what its HB bank holds), SwiGLU runs locally into each PE's HBUF slice, the
  per-token max |h| is all-reduced (``SEND ROWMAX`` -> ``REDUCE_MAX`` -> ``RECV ROWMAX``) so
  that every PE's REQUANT uses the global max; the down projection is split by K (each PE's own
  h slice); the root PE adds the other PEs' RAW psums (``REDUCE_ADD``) with ``GEMM.psum_in``
  before COMBINE.
* **verify**, HB-cached expert (MSB from HB with TP, LSB from EXT with DP, psum-level
  synchronisation): up/gate column blocks are owned by the PE whose HB holds their MSB slices;
  the tokens are split across the PEs by row blocks. For each chunk of column blocks the owner
  runs MSB_ONLY GEMMs for every other PE's tokens (RAW psums, ``BYPASS`` to that PE) and a FULL
  GEMM (MSB from HB, LSB multicast from EXT) for its own tokens; every other PE runs an
  LSB_ONLY GEMM for its tokens and adds the owner's psums with ``psum_in`` before SwiGLU. So a
  token's whole h row ends on its token owner (no row-max exchange); REQUANT there; the INT8 h
  rows are scattered to the K-slice owners (``ALL_TO_ALL``, one source at a time); the down
  projection runs MSB_ONLY on each PE's K slice for every token slice (``REDUCE_ADD`` to the
  token owner) and LSB_ONLY over all of K on the token owner, which adds the reduced MSB psums
  with ``psum_in`` before COMBINE. A final ``REDUCE_ADD`` of the OUT rows to the root.
* **verify**, uncached expert: streamed whole from EXT (FULL, weights multicast to the PEs
  holding tokens of it, DP over row blocks), no exchange.

Because the accumulators are exact integers, every split equals the single-PE golden result
(:func:`~elmoe3d.sw.golden.expert.ref_moe`, :func:`~elmoe3d.sw.golden.expert.build_moe_program` on
:mod:`elmoe3d.sw.golden.pe`) bit for bit.

Deadlock freedom (``docs/parallel.md``, "Deadlock freedom"): a PE runs its execute commands in
order and the link runs its descriptors in order, so every exchange is cut into *steps*: in a
step every PE issues all its sends before its receives, the descriptors follow the steps, and a
destination receives at most ``buffer_words`` words in one step (the link's per-destination
FIFO absorbs them). :func:`check_link_schedule` checks this on a word-level model of the PEs'
engines, the link's FIFOs and the ring's EXT FIFOs (it raises :class:`LinkScheduleError` on a
deadlock or an unread word); :func:`run_group`
runs the programs in phases on one :class:`~elmoe3d.sw.golden.pe.PEState` per PE, moving
``link_o`` words through :func:`~elmoe3d.sw.golden.agg_link.ref_link` descriptor by descriptor.

Interface for the die's top and the multi-PE bench: :func:`compile_group` returns a
:class:`GroupJob` (``programs``, ``streams(p)`` per source, ``hb_images``, ``ext_transfers``,
``link_ops``, ``root``, :meth:`GroupJob.decode`); :func:`run_group` returns a
:class:`GroupResult`.

Plain NumPy; never imports Amaranth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ...checks import check_int, is_int
from ...config import EXT_CHUNK_WORDS, ArchConfig, PEConfig
from ...isa import SCALES_PER_WORD, OKind, Op, Sink, Source, Target
from ..golden import pe as fsim
from ..golden.asm import (Program, ProgramError, pack_act, pack_tok, pack_weight_matrix,
                          pe_config, words_to_ints)
from ..golden.datapath import Mode
from ..golden.expert import as_expert, check_x, expert_tokens, parse_routing, updown_order
from ..golden.agg_link import LinkMode, LinkOp, ref_link
from ..golden.ext_sched import ext_pick
from ..golden.quant import GROUP, quantize_activations


__all__ = ["PHASES", "DEFAULT_BUFFER_WORDS", "LinkScheduleError", "ExtTransfer",
           "ext_load_order", "GroupJob",
           "GroupResult", "compile_group", "group_pe", "group_routing", "run_group",
           "check_link_schedule", "link_actions", "DEFAULT_EXT_FIFO_WORDS"]

#: Phases of speculative decoding a group program runs (paper Section 5.1).
PHASES = ("draft", "verify")
#: Default depth (W-bit words) of the aggregation link's per-destination FIFO that the compiler
#: may fill ahead of a destination's RECV / psum_in GEMM (the RTL's default,
#: ``elmoe3d.hw.agg_link.DEFAULT_BUFFER_WORDS``; a test checks they agree).
DEFAULT_BUFFER_WORDS = 32


class LinkScheduleError(ProgramError):
    """The PE programs and link descriptors of a group do not fit together: a deadlock (the
    message lists what every PE and the link wait for), words sent that no descriptor takes,
    or words delivered that no PE reads."""


# ---- inputs --------------------------------------------------------------------------------------

def group_routing(routing, tokens: int, n_experts: int, group_experts=None):
    """``(ids int64 [T, k], weights float16 [T, k])`` of ``routing`` restricted to the experts
    ``group_experts`` (default: all): the slots naming other experts become empty (-1, weight
    0). This is the routing the group's result equals :func:`~elmoe3d.sw.golden.expert.ref_moe` for.
    ValueError naming ``routing`` or ``group_experts``."""
    ids, bits = parse_routing(routing, tokens, n_experts)
    if group_experts is None:
        keep = np.ones(n_experts, bool)
    else:
        keep = np.zeros(n_experts, bool)
        for e in group_experts:
            if not is_int(e) or not 0 <= e < n_experts:
                raise ValueError(f"group_experts: expert id {e!r} is not in 0..{n_experts - 1}")
            keep[int(e)] = True
    live = (ids >= 0) & keep[np.clip(ids, 0, None)]
    ids = np.where(live, ids, -1)
    bits = np.where(live, bits, 0).astype(np.uint16)
    return ids, bits.view(np.float16)


# ---- weights in column blocks, HB and EXT images -----------------------------------------

class _Mat:
    """A weight matrix (rows = output channels, K = 32 * groups) in column blocks of ``lanes``
    rows: nibble planes ``[cb, g, L, 32]`` and FP16 scale bits ``[cb, g, L]``; its words as
    stored in HB or EXT: plane words ``cb * groups + g``, scale entries packed 8 per word in the
    same order (the last word zero-padded)."""

    def __init__(self, q, scale_bits, pe: PEConfig):
        n_rows, k = q.shape
        assert n_rows % pe.lanes == 0, (n_rows, pe.lanes)
        self.pe = pe
        self.groups = G = k // GROUP
        self.n_cb = n_rows // pe.lanes
        msb, lsb, scl = pack_weight_matrix(q, scale_bits, pe)
        self.words = {Target.WMSB: words_to_ints(msb), Target.WLSB: words_to_ints(lsb),
                      Target.WSCALE: words_to_ints(scl)}
        #: column blocks of whole scale words: cuts at multiples of it keep them whole
        self.align = SCALES_PER_WORD // math.gcd(G, SCALES_PER_WORD)

    def span(self, target, j0, n) -> tuple:
        """(first word, words) of column blocks ``j0 .. j0+n-1`` in ``target``'s words."""
        G = self.groups
        if target is Target.WSCALE:
            S = SCALES_PER_WORD
            assert (j0 * G) % S == 0, (j0, G)
            return j0 * G // S, -(-(j0 + n) * G // S) - j0 * G // S
        return j0 * G, n * G


class _Store:
    """A memory image (HB bank or external memory) in W-bit words, allocated in order."""

    def __init__(self):
        self.words: list = []

    def put(self, words) -> int:
        addr = len(self.words)
        self.words.extend(words)
        return addr


@dataclass
class _Placed:
    """A matrix placed in a store: its words per target at base addresses."""

    mat: _Mat
    store: _Store
    base: dict

    def load(self, target, j0, n) -> tuple:
        """(words, address) of a chunk of column blocks."""
        a, k = self.mat.span(target, j0, n)
        addr = self.base[target] + a
        return self.store.words[addr:addr + k], addr


def _place(mat, store, targets) -> _Placed:
    return _Placed(mat, store, {t: store.put(mat.words[t]) for t in targets})


def _updown(ex, pe):
    """Interleaved up/gate matrix (the builder's layout: blocks of L/4 up then L/4 gate rows)
    and the down matrix as ``(q, scale bits)`` pairs."""
    order = updown_order(ex.intermediate, pe.lanes)
    q = np.concatenate([ex.up.q, ex.gate.q])[order]
    s = np.concatenate([np.asarray(ex.up.scale, np.float16),
                        np.asarray(ex.gate.scale, np.float16)]).view(np.uint16)[order]
    dq = ex.down.q
    ds = np.asarray(ex.down.scale, np.float16).view(np.uint16)
    return (q, s), (dq, ds)


# ---- the compiled group program ----------------------------------------------------------------

@dataclass(frozen=True)
class ExtTransfer:
    """One external-memory read streamed on the streamline ring: ``words`` (W-bit ints) read
    from EXT word address ``addr`` and delivered, in order, to every PE of the group in
    ``dst_mask`` (bit p = PE p; several bits = multicast). Every PE's EXT LOAD words are the
    transfers naming it, in this order."""

    addr: int
    words: tuple
    dst_mask: int
    what: str = ""

    @property
    def dsts(self) -> list:
        return [p for p in range(self.dst_mask.bit_length()) if self.dst_mask >> p & 1]


def ext_load_order(job) -> list:
    """A :class:`GroupJob`'s EXT transfers re-ordered for the die's EXT scheduler
    (:class:`elmoe3d.hw.ext_sched.ExtScheduler`): in the order the group's load engines start
    their EXT LOADs when EXT words are always at hand (:func:`check_link_schedule`'s
    ``ext_log``; one transfer per EXT LOAD, a multicast once all its PEs have started its
    LOAD and have their earlier transfers placed). Every PE's transfers keep their order;
    the PEs' runs are interleaved as their programs consume them, so the scheduler's window
    holds the next transfers of several PEs instead of one PE's long run, and no PE's
    transfer sits before words another PE must first receive to let it drain (the compiled
    order's guarantee, kept). Timing-free: the credits decide the order on the ring. For
    unicast transfers only (a streamed group's, :mod:`elmoe3d.sw.host.stream_group`) this is
    simply the ``ext_log`` order."""
    log: list = []
    check_link_schedule(job.programs, job.link_ops, buffer_words=job.buffer_words, pe=job.pe,
                        ext_log=log)
    trs = job.ext_transfers
    mine = [[i for i, t in enumerate(trs) if t.dst_mask >> p & 1] for p in range(job.pes)]
    reached = [0] * job.pes                 # EXT LOADs PE p has started
    head = [0] * job.pes                    # PE p's transfers placed
    out = []
    for p in log:
        reached[p] += 1
        moved = True
        while moved:                        # place every transfer all of whose PEs have
            moved = False                   # started its LOAD and placed their earlier ones
            for q in range(job.pes):
                if head[q] >= min(reached[q], len(mine[q])):
                    continue
                i = mine[q][head[q]]
                dsts = trs[i].dsts
                if all(head[r] < reached[r] and mine[r][head[r]] == i for r in dsts):
                    out.append(trs[i])
                    for r in dsts:
                        head[r] += 1
                    moved = True
    if len(out) != len(job.ext_transfers):
        raise LinkScheduleError(f"ext_load_order: {len(job.ext_transfers)} transfers but the "
                                f"EXT LOADs placed {len(out)}")
    return out


@dataclass(eq=False)
class GroupJob:
    """The programs of one PE group for one MoE layer (:func:`compile_group`).

    Attributes
    ----------
    pe : PEConfig
    pes : int
        G, the PEs of the group (PE indices 0..G-1 = link ports).
    phase : str
        ``"draft"`` or ``"verify"``.
    mode : Mode
        The numerics the result equals :func:`~elmoe3d.sw.golden.expert.ref_moe` in (DRAFT or
        FULL).
    programs : list of Program
        One command program per PE.
    ld : list of list of int
        Each PE's ``ld`` words in LOAD order (all sources merged: what the PE sees).
    load_src : list of list of (command index, Source, hb_addr, words)
        Each PE's LOADs with their source and word count (``ld`` is their concatenation).
    hb_images : list of list of int
        Each PE's HB bank contents from word 0 (W-bit ints): MSB planes and scales of its
        slices of the HB-resident experts (the same bytes serve draft and verify).
    ext_image : list of int
        External-memory contents from word 0: LSB planes and scale copies of the HB-resident
        experts, whole uncached experts.
    ext_transfers : list of ExtTransfer
        The ring's external reads in order (multicast masks).
    link_ops : list of LinkOp
        The aggregation link's descriptors in order.
    root : int
        The PE whose OUTPUT emits the layer's FP32 result ``[T, H]``.
    tokens, hidden : int
    buffer_words : int
        The link FIFO depth the schedule was cut for.
    info : dict
        Per-expert figures (tokens, token slices, chunks) and the routing used.
    """

    pe: PEConfig
    pes: int
    phase: str
    mode: Mode
    programs: list
    ld: list
    load_src: list
    hb_images: list
    ext_image: list
    ext_transfers: list
    link_ops: list
    root: int
    tokens: int
    hidden: int
    buffer_words: int
    info: dict = field(default_factory=dict)

    def streams(self, p: int) -> dict:
        """PE ``p``'s ``ld`` words split by source: ``{Source.HOST: [...], Source.HB: [...],
        Source.EXT: [...]}``, each in LOAD order (what the die's load router forwards from
        that source)."""
        out = {s: [] for s in Source}
        pos = 0
        for _, src, _, n in self.load_src[p]:
            out[src].extend(self.ld[p][pos:pos + n])
            pos += n
        return out

    def hb_reads(self, p: int) -> list:
        """PE ``p``'s HB reads in LOAD order: ``(hb_addr, words)`` each."""
        return [(addr, n) for _, src, addr, n in self.load_src[p] if src is Source.HB]

    def traffic(self) -> dict:
        """Bytes and words moved, from the programs and descriptors:

        ``hb_bytes[p]`` (by target: ``WMSB``, ``WSCALE``), ``ext_ring_bytes`` (each transfer
        once, by what), ``ext_pe_bytes[p]`` (bytes each PE receives from the ring, multicast
        counted per receiving PE), ``host_bytes[p]``, ``link_words_sent`` (words the sources
        put on the link), ``link_words_delivered`` (words the destinations take) and
        ``link_ops`` (descriptors per mode)."""
        nb = self.pe.word_bytes
        hb = []
        host = []
        for p in range(self.pes):
            per = {}
            h = 0
            for i, src, _, n in self.load_src[p]:
                t = Target(self.programs[p][i].fields["target"]).name
                if src is Source.HB:
                    per[t] = per.get(t, 0) + n * nb
                elif src is Source.HOST:
                    h += n * nb
            hb.append(per)
            host.append(h)
        ring = {}
        pe_ext = [0] * self.pes
        for tr in self.ext_transfers:
            ring[tr.what] = ring.get(tr.what, 0) + len(tr.words) * nb
            for p in tr.dsts:
                pe_ext[p] += len(tr.words) * nb
        sent = sum(op.words * len(op.srcs) for op in self.link_ops)
        got = sum(op.delivered_words() * len(op.dsts) for op in self.link_ops)
        modes = {}
        for op in self.link_ops:
            modes[op.mode.name] = modes.get(op.mode.name, 0) + 1
        return {"hb_bytes": hb, "ext_ring_bytes": ring, "ext_pe_bytes": pe_ext,
                "host_bytes": host, "link_words_sent": sent, "link_words_delivered": got,
                "link_ops": modes}

    def decode(self, data: np.ndarray) -> np.ndarray:
        """``float32 [T, H]`` from the root's DATA beats' FP32 values (``[beats, W/32]``)."""
        vals = np.asarray(data, np.float32)
        return vals.reshape(-1, self.hidden)[:self.tokens]

    def root_out(self, state) -> np.ndarray | None:
        """The root's Q.24 sums ``int64 [T, H]`` from its final state (OUT holds them all)."""
        T, H = self.tokens, self.hidden
        return state.out_values()[:T * H].reshape(T, H).copy()


# ---- per-PE program emission -----------------------------------------------------------------

class _Job:
    """One WMEM buffer-full on one PE: its loads (the last one signals); the GEMMs that read it
    (the first waits, the last releases) are items of the PE's list."""

    def __init__(self, loads):
        self.loads = loads        # (target, words, src, hb_addr)
        self.k = -1               # its number on the PE (buffer k % 2)


class _PEBuild:
    """One PE's program under construction: an expert at a time, as a list of items (GEMMs on
    buffer-full jobs, other commands), emitted by :meth:`flush`."""

    def __init__(self, pe: PEConfig, index: int):
        self.pe = pe
        self.index = index
        self.prog = Program(pe)
        self.ld: list = []
        self.load_src: list = []
        self.items: list = []          # ("gemm", _Job, fields) / ("cmd", name, kw)
        self.jobs: list = []
        self.prologue: list = []

    def load(self, target, addr, words, *, src, hb_addr=0, buf=0, signal=False, fence=False):
        i = self.prog.load(target, addr, len(words), buf=buf, signal=signal, fence=fence,
                           src=src, hb_addr=hb_addr)
        self.ld.extend(int(w) for w in words)
        self.load_src.append((i, Source(src), hb_addr, len(words)))

    def job(self, loads) -> _Job:
        job = _Job(loads)
        job.k = len(self.jobs)
        self.jobs.append(job)
        return job

    def gemm(self, job, **fields):
        self.items.append(("gemm", job, fields))

    def cmd(self, name, **kw):
        self.items.append(("cmd", name, kw))

    def flush(self):
        """Emit the current expert: its HOST prologue (the first load fenced: it reuses the
        IOMEM region of the previous expert), then the items. Weight loads are double
        buffered: job k uses buffer k % 2 and its loads follow the GEMM that releases job
        k - 2 (the jobs' GEMMs must start in job order, each job's after job k - 2's last)."""
        if not self.items:
            self.prologue, self.jobs = [], []
            return
        for n, (target, addr, words) in enumerate(self.prologue):
            self.load(target, addr, words, src=Source.HOST, fence=n == 0)
        first, last = {}, {}
        for n, it in enumerate(self.items):
            if it[0] == "gemm":
                first.setdefault(it[1].k, n)
                last[it[1].k] = n
        assert sorted(first) == list(range(len(self.jobs))), "every job needs a GEMM"
        nxt = [0]

        def loads(upto):
            while nxt[0] < min(upto, len(self.jobs)):
                job = self.jobs[nxt[0]]
                for n, (target, words, src, hb) in enumerate(job.loads):
                    self.load(target, 0, words, src=src, hb_addr=hb, buf=job.k % 2,
                              signal=n == len(job.loads) - 1)
                nxt[0] += 1

        loads(2)
        rq_open = False
        for n, it in enumerate(self.items):
            if it[0] == "cmd":
                getattr(self.prog, it[1])(**it[2])
                rq_open = it[1] == "requant"
                continue
            _, job, fields = it
            assert nxt[0] > job.k, "a job's loads precede its GEMMs"
            self.prog.gemm(wbuf=job.k % 2, wait=first[job.k] == n, release=last[job.k] == n,
                           rq_wait=rq_open, **fields)
            rq_open = False
            if last[job.k] == n:
                loads(job.k + 3)
        self.items, self.jobs, self.prologue = [], [], []


def _cuts(n_cb, limit, align, what):
    """Column blocks per chunk: ``limit`` rounded down to a multiple of ``align`` (whole scale
    words) each, the remainder last. ``limit`` below ``align``: a ProgramError (a WMEM buffer
    too small for whole scale words) naming ``what``."""
    step = limit // align * align
    if step < 1:
        raise ProgramError(f"{what}: chunks of whole scale words need {align} column blocks; "
                           f"only {limit} fit")
    sizes = [step] * (n_cb // step)
    if n_cb % step:
        sizes.append(n_cb % step)
    return sizes


def _slices(rbn, pes, first=0):
    """Row blocks ``[r0, r1)`` of each PE (DP over tokens): contiguous in PE order, sizes
    differing by at most one, the larger ones on PEs ``first, first+1, ...`` (mod G; the
    compiler rotates ``first`` from expert to expert to spread the extra row blocks)."""
    base, extra = divmod(rbn, pes)
    out, r = [], 0
    for p in range(pes):
        n = base + (1 if (p - first) % pes < extra else 0)
        out.append((r, r + n))
        r += n
    return out


def _mask(pes_list):
    m = 0
    for p in pes_list:
        m |= 1 << p
    return m


# ---- the compiler ------------------------------------------------------------------------------

def group_pe(config, pes=None) -> tuple:
    """``(PEConfig, G)`` of a group compile: an ArchConfig gives its PE and ``pes_per_group``
    (``pes`` overrides it); a PEConfig needs ``pes``. ValueError / TypeError naming ``pes`` /
    ``config`` otherwise."""
    if isinstance(config, ArchConfig):
        return config.pe, config.pes_per_group if pes is None else pes
    if isinstance(config, PEConfig):
        if pes is None:
            raise ValueError("pes: required with a PEConfig (an ArchConfig gives "
                             "pes_per_group)")
        return config, pes
    raise TypeError(f"config: expected an ArchConfig or a PEConfig, got "
                    f"{type(config).__name__}")


def compile_group(x, experts, routing, *, phase, config, pes=None, cached=None,
                  group_experts=None, buffer_words: int = DEFAULT_BUFFER_WORDS,
                  root: int = 0) -> GroupJob:
    """Compile one MoE layer's expert work for a PE group (module docstring,
    ``docs/parallel.md``).

    Parameters
    ----------
    x : float ``[T, H]`` (T <= 256)
        The layer's tokens (activations replicated on every PE of the group).
    experts : sequence of Expert / ``(w_up, w_gate, w_down)`` / dict
        All the layer's experts (same shapes).
    routing : ``(ids, weights)`` ``[T, k]``, as for :func:`~elmoe3d.sw.golden.expert.ref_moe`
    phase : ``"draft"`` or ``"verify"``
        draft: DRAFT numerics, every routed expert must be HB-resident; verify: FULL numerics.
    config : ArchConfig (or PEConfig with ``pes``)
    pes : int, optional
        G, PEs in the group (default ``config.pes_per_group``), at least 2.
    cached : iterable of expert ids, optional
        The HB-resident experts (their MSB slices and scales are split across the group's HB
        banks); default all of ``group_experts``.
    group_experts : iterable of expert ids, optional
        The experts this group serves (default all); tokens' other slots are ignored
        (:func:`group_routing`).
    buffer_words : int
        Depth of the link's per-destination FIFO: no step of the schedule sends a destination
        more words.
    root : int
        The PE that emits the result.

    Returns
    -------
    GroupJob

    Raises
    ------
    ValueError
        A bad parameter (the message names it): ``pes`` not dividing an HB-resident expert's
        up/gate column blocks or giving an intermediate slice that is not a multiple of 32 and
        W/32; ``phase``; ``cached`` (not an iterable of integer ids of ``group_experts``);
        ``routing`` (draft tokens routed to an expert not in HB);
        ``buffer_words`` too small for one column block; expert shapes (K mismatches).
    ProgramError
        The shapes do not fit the PE's memories.
    """
    if phase not in PHASES:
        raise ValueError(f"phase: expected one of {PHASES}, got {phase!r}")
    pe, pes = group_pe(config, pes)
    G = check_int("pes", pes, 2)
    if G > 16:
        raise ValueError(f"pes: at most 16 PEs per group (link masks), got {G}")
    buffer_words = check_int("buffer_words", buffer_words, 1)
    root = check_int("root", root, 0)
    if root >= G:
        raise ValueError(f"root: expected a PE index in 0..{G - 1}, got {root}")
    mode = Mode.DRAFT if phase == "draft" else Mode.FULL
    exs = [as_expert(e, f"expert {i}") for i, e in enumerate(experts)]
    if not exs:
        raise ValueError("experts: expected at least one expert")
    for i, e in enumerate(exs):
        if (e.hidden, e.intermediate) != (exs[0].hidden, exs[0].intermediate):
            raise ValueError(f"experts: expert {i} has H={e.hidden}, I={e.intermediate}, "
                             f"expert 0 has H={exs[0].hidden}, I={exs[0].intermediate}")
    x = np.asarray(x)
    T = check_x(x, exs[0])
    if not 1 <= T <= 256:
        raise ValueError(f"x: expected 1..256 tokens (the TOK slot field), got {T}")
    n_exp = len(exs)
    ids, gw16 = group_routing(routing, T, n_exp, group_experts)
    bits = gw16.view(np.uint16)
    grp = sorted(set(range(n_exp) if group_experts is None else map(int, group_experts)))
    if cached is None:
        hb_set = list(grp)
    else:
        if isinstance(cached, (str, bytes)) or not hasattr(cached, "__iter__"):
            raise ValueError(f"cached: expected an iterable of expert ids, got {cached!r}")
        cached = list(cached)
        for e in cached:
            if not is_int(e):
                raise ValueError(f"cached: expected integer expert ids, got {e!r}")
        hb_set = sorted(set(int(e) for e in cached))
        bad = [e for e in hb_set if e not in grp]
        if bad:
            raise ValueError(f"cached: expert(s) {bad} are not served by this group "
                             f"(group_experts {grp})")
    H, I = exs[0].hidden, exs[0].intermediate
    L, R = pe.lanes, pe.rows
    for name, v in (("H", H), ("I", I)):
        if v % GROUP or v % pe.q16_per_word or v % L:
            raise ProgramError(f"experts: {name} = {v} must be a multiple of {GROUP}, of W/32 = "
                               f"{pe.q16_per_word} and of lanes = {L}")
    t_pad = -(-T // R) * R
    out_words = t_pad * H // pe.q24_per_word
    if out_words > pe.out_words:
        raise ProgramError(f"{T} tokens x H={H} need {out_words} OUT words; the PE has "
                           f"{pe.out_words}")
    n_cb = 2 * I // L
    if n_cb % G or (I // G) % GROUP or (I // G) % pe.q16_per_word:
        if hb_set:
            raise ValueError(
                f"pes: {G} PEs must divide the {n_cb} up/gate column blocks of the HB-resident "
                f"experts into intermediate slices of a multiple of {GROUP} and of W/32 = "
                f"{pe.q16_per_word} channels (I = {I})")
    routed = [e for e in range(n_exp) if (ids == e).any()]
    if phase == "draft":
        cold = [e for e in routed if e not in hb_set]
        if cold:
            t = int(np.argwhere(np.isin(ids, cold))[0][0])
            raise ValueError(f"routing: the draft routes token {t} to expert(s) {cold}, which "
                             f"are not HB-resident (cached {hb_set}); the draft runs HB "
                             f"experts only")
    xq = quantize_activations(x, name="x")

    # ---- memory images: HB banks (MSB slices + scales of the HB experts), EXT ----
    hb = [_Store() for _ in range(G)]
    ext = _Store()
    ncp, Ip = n_cb // G, I // G
    placed = {}
    for e in grp:
        (uq, us), (dq, ds) = _updown(exs[e], pe)
        if e in hb_set:
            ug_sl = [_Mat(uq[p * ncp * L:(p + 1) * ncp * L], us[p * ncp * L:(p + 1) * ncp * L],
                          pe) for p in range(G)]
            g0 = Ip // GROUP
            dn_sl = [_Mat(dq[:, p * Ip:(p + 1) * Ip], ds[:, p * g0:(p + 1) * g0], pe)
                     for p in range(G)]
            dn_all = _Mat(dq, ds, pe)
            placed[e] = {
                "ug_hb": [_place(ug_sl[p], hb[p], (Target.WMSB, Target.WSCALE))
                          for p in range(G)],
                "dn_hb": [_place(dn_sl[p], hb[p], (Target.WMSB, Target.WSCALE))
                          for p in range(G)],
                "ug_ext": [_place(ug_sl[p], ext, (Target.WLSB, Target.WSCALE))
                           for p in range(G)],
                "dn_ext": _place(dn_all, ext, (Target.WLSB, Target.WSCALE)),
            }
        else:
            both = (Target.WMSB, Target.WLSB, Target.WSCALE)
            placed[e] = {"ug_ext": _place(_Mat(uq, us, pe), ext, both),
                         "dn_ext": _place(_Mat(dq, ds, pe), ext, both)}

    builds = [_PEBuild(pe, p) for p in range(G)]
    for b in builds:
        b.prog.clear(out=True, rowmax=True, flags=True, counters=True)
    ops: list = []
    transfers: list = []
    info = {"experts": {}, "routing": (ids, gw16)}
    ctx = _Ctx(pe=pe, G=G, H=H, I=I, buffer_words=buffer_words, root=root, builds=builds,
               ops=ops, transfers=transfers)

    for e in routed:
        rows, gw = expert_tokens(ids, bits, e)
        te = len(rows)
        prologue = _prologue(pe, e, xq.q[rows], xq.exp[rows], gw, rows)
        rbn = -(-te // R)
        ctx.expert = e
        if phase == "draft":
            rec = _draft_expert(ctx, placed[e], rbn, prologue)
        elif e in hb_set:
            rec = _verify_cached(ctx, placed[e], rbn, prologue)
        else:
            rec = _verify_uncached(ctx, placed[e], rbn, prologue)
        rec.update(tokens=te, row_blocks=rbn, hb=e in hb_set)
        info["experts"][e] = rec
        for b in builds:
            b.flush()

    if phase == "verify":
        # final reduction: every PE holds the outputs of its token slices; OUT rows summed on
        # the root (exact Q.24 additions, saturating)
        others = [p for p in range(G) if p != root]
        for a in range(0, out_words, buffer_words):
            n = min(buffer_words, out_words - a)
            ops.append(LinkOp(LinkMode.REDUCE_ADD, _mask(others), 1 << root, n))
            for p in others:
                builds[p].prog.send(Target.OUT, a, n)
            builds[root].prog.recv(Target.OUT, a, n, accumulate=True)
    builds[root].prog.output(row_blocks=t_pad // R, channels=H)
    for b in builds:
        b.prog.status()
        b.prog.check_sync()
    info["steps"] = ctx.steps
    return GroupJob(pe=pe, pes=G, phase=phase, mode=mode,
                    programs=[b.prog for b in builds], ld=[b.ld for b in builds],
                    load_src=[b.load_src for b in builds],
                    hb_images=[list(h.words) for h in hb], ext_image=list(ext.words),
                    ext_transfers=transfers, link_ops=ops, root=root, tokens=T, hidden=H,
                    buffer_words=buffer_words, info=info)


def _prologue(pe, e, x_q, e_x, gw_bits, slots) -> list:
    """An expert's HOST loads, the same on every PE (activations replicated): its TOK entries
    (``e_x``, gate weight, output slot; ``e_h`` written by REQUANT) at entry 0 and its INT8 x
    rows at ACT word 0 (``(rb, g)`` at ``rb * H/32 + g``), padded to whole row blocks."""
    R = pe.rows
    te, h_dim = x_q.shape
    t_pad = -(-te // R) * R
    if t_pad > min(pe.tok_entries, 256):
        raise ProgramError(f"expert {e}: {te} tokens need {t_pad} TOK entries; the PE has "
                           f"{min(pe.tok_entries, 256)}")
    e_x = np.asarray(e_x, np.int64)
    if e_x.min() < -128 or e_x.max() > 127:
        raise ProgramError(f"activation exponents {e_x.min()}..{e_x.max()} do not fit the "
                           f"TOK entry's signed 8-bit e_x (scale the input)")
    tok = {"e_x": np.zeros(t_pad, np.int64), "e_h": np.zeros(t_pad, np.int64),
           "gate": np.zeros(t_pad, np.uint16), "slot": np.zeros(t_pad, np.int64)}
    tok["e_x"][:te], tok["gate"][:te], tok["slot"][:te] = e_x, gw_bits, slots
    xp = np.zeros((t_pad, h_dim), np.int8)
    xp[:te] = x_q
    act = xp.reshape(t_pad // R, R, h_dim // GROUP, GROUP).transpose(0, 2, 1, 3).reshape(
        -1, R, GROUP)
    return [(Target.TOK, 0, words_to_ints(pack_tok(tok, pe))),
            (Target.ACT, 0, words_to_ints(pack_act(act, pe)))]


def _fits(what, used, size, e):
    if used > size:
        raise ProgramError(f"expert {e}: {what} need {used} words; the PE has {size}")


@dataclass
class _Ctx:
    pe: PEConfig
    G: int
    H: int
    I: int
    buffer_words: int
    root: int
    builds: list
    ops: list
    transfers: list
    steps: int = 0
    expert: int = -1
    rotate: int = 0               # first PE of the next expert's larger token slices

    @property
    def wpr(self) -> int:
        """Link words of one GEMM result (rows x lanes Q.24 values)."""
        return self.pe.rows * self.pe.lanes // self.pe.q24_per_word

    def ext(self, placed: _Placed, target, j0, n, dsts, what):
        """An EXT transfer of a chunk to ``dsts``; returns (words, addr)."""
        words, addr = placed.load(target, j0, n)
        if dsts:
            self.transfers.append(ExtTransfer(addr, tuple(words), _mask(dsts), what))
        return words, addr

    def cap(self, rbs, what):
        """Column blocks per chunk that keep a destination's words of one step within the
        link FIFO, for results of ``rbs`` row blocks."""
        per_cb = max(rbs, 1) * self.wpr
        if per_cb > self.buffer_words:
            raise ValueError(f"buffer_words: {self.buffer_words} words cannot hold the "
                             f"{per_cb} psum words of one column block of {what} "
                             f"({rbs} row blocks)")
        return self.buffer_words // per_cb


def _steps(n, m):
    """Sub-ranges ``(s0, size)`` of ``n`` column blocks, ``m`` at most each."""
    return [(s0, min(m, n - s0)) for s0 in range(0, n, m)]


def _draft_expert(ctx: _Ctx, pl, rbn, prologue) -> dict:
    """HB-only tensor parallelism (DRAFT): channel-split up/gate with local SwiGLU, row-max
    all-reduce, REQUANT of each PE's h slice, K-split down reduced into the root's COMBINE."""
    pe, G, H, I, B = ctx.pe, ctx.G, ctx.H, ctx.I, ctx.builds
    L, R, Gu = pe.lanes, pe.rows, H // GROUP
    Ip = I // G
    Gp = Ip // GROUP
    _fits(f"{rbn} row blocks of x and of the h slice (ACT)", rbn * max(Gu, Gp), pe.act_words,
          ctx.expert)
    _fits(f"{rbn * R} HBUF rows of {Ip} channels", rbn * R * Ip // pe.q16_per_word,
          pe.hbuf_words, ctx.expert)
    for b in B:
        b.prologue = prologue
    per_u = pe.wmem_words // Gu
    sizes_u = None
    for p in range(G):
        m = pl["ug_hb"][p]
        sizes_u = _cuts(m.mat.n_cb, per_u, m.mat.align, "up/gate chunk (WMEM buffer)")
        j0 = 0
        for n in sizes_u:
            msb, a_m = m.load(Target.WMSB, j0, n)
            scl, a_s = m.load(Target.WSCALE, j0, n)
            job = B[p].job([(Target.WMSB, msb, Source.HB, a_m),
                            (Target.WSCALE, scl, Source.HB, a_s)])
            B[p].gemm(job, mode=Mode.DRAFT, act_base=0, w_base=0, row_blocks=rbn,
                      col_blocks=n, groups=Gu, sink=Sink.SWIGLU, out_base=j0 * L // 2,
                      tok_base=0, stride=Ip // pe.q16_per_word)
            j0 += n
    # all-reduce of the per-token max |h| (W/32 row-max registers per word)
    rw = -(-rbn * R // pe.q16_per_word)
    for a in range(0, rw, ctx.buffer_words):
        n = min(ctx.buffer_words, rw - a)
        ctx.ops.append(LinkOp(LinkMode.REDUCE_MAX, _mask(range(G)), _mask(range(G)), n))
        for b in B:
            b.cmd("send", target=Target.ROWMAX, addr=a, words=n)
            b.cmd("recv", target=Target.ROWMAX, addr=a, words=n)
        ctx.steps += 1
    for b in B:
        b.cmd("requant", row_blocks=rbn, channels=Ip, act_base=0, tok_base=0)
    # down: K split; per step, RAW psums of the other PEs reduced into the root's COMBINE
    dn = pl["dn_hb"][0].mat
    sizes_d = _cuts(dn.n_cb, pe.wmem_words // Gp, dn.align, "down chunk (WMEM buffer)")
    step = ctx.cap(rbn, "the down projection")
    others = [p for p in range(G) if p != ctx.root]
    j0 = 0
    for n in sizes_d:
        jobs = []
        for p in range(G):
            m = pl["dn_hb"][p]
            msb, a_m = m.load(Target.WMSB, j0, n)
            scl, a_s = m.load(Target.WSCALE, j0, n)
            jobs.append(B[p].job([(Target.WMSB, msb, Source.HB, a_m),
                                  (Target.WSCALE, scl, Source.HB, a_s)]))
        for s0, k in _steps(n, step):
            for p in range(G):
                g = dict(mode=Mode.DRAFT, act_base=0, w_base=s0 * Gp, row_blocks=rbn,
                         col_blocks=k, groups=Gp, tok_base=0)
                if p == ctx.root:
                    g.update(sink=Sink.COMBINE, out_base=(j0 + s0) * L,
                             stride=H // pe.q24_per_word, psum_in=True)
                else:
                    g.update(sink=Sink.RAW)
                B[p].gemm(jobs[p], **g)
            ctx.ops.append(LinkOp(LinkMode.REDUCE_ADD, _mask(others), 1 << ctx.root,
                                  k * rbn * ctx.wpr))
            ctx.steps += 1
        j0 += n
    return {"up_chunks": sizes_u, "down_chunks": sizes_d, "link_step_cbs": step}


def _verify_cached(ctx: _Ctx, pl, rbn, prologue) -> dict:
    """Verify of an HB-resident expert: MSB (HB, TP by channel / K) + LSB (EXT, DP by token
    row blocks), synchronised at psum level (paper Section 5.2, Fig. 10)."""
    pe, G, H, I, B = ctx.pe, ctx.G, ctx.H, ctx.I, ctx.builds
    L, R, Gu = pe.lanes, pe.rows, H // GROUP
    Ip = I // G
    Gp, Ga = Ip // GROUP, I // GROUP
    sl = _slices(rbn, G, ctx.rotate)
    ctx.rotate += rbn % G
    rbs = [r1 - r0 for r0, r1 in sl]
    Q = [q for q in range(G) if rbs[q]]
    for b in B:
        b.prologue = prologue
    # ACT: x rows at 0 (all tokens); the token owner's h rows (REQUANT) at 0 over them; the
    # K-slice layout of every token's h at HA_p (after the owner's rows)
    ha = [rbs[p] * Ga for p in range(G)]
    for p in range(G):
        _fits(f"PE {p}'s x rows, h rows and K-slice h of all {rbn} row blocks (ACT)",
              max(rbn * Gu, ha[p] + rbn * Gp), pe.act_words, ctx.expert)
    _fits(f"HBUF rows up to {rbn * R} of {I} channels", rbn * R * I // pe.q16_per_word,
          pe.hbuf_words, ctx.expert)
    # up/gate: buffer-full chunks of slice o, cut into link steps; in a step the owner o
    # sends MSB_ONLY psums to every other token owner, which adds them to its LSB_ONLY
    # result before SwiGLU; the owner's own tokens run FULL
    per_u = pe.wmem_words // Gu
    step = ctx.cap(max(rbs), "the up/gate projection")
    sizes_u = []
    for o in range(G):
        m_hb, m_ext = pl["ug_hb"][o], pl["ug_ext"][o]
        sizes = _cuts(m_hb.mat.n_cb, per_u, m_hb.mat.align, "up/gate chunk (WMEM buffer)")
        sizes_u.append(sizes)
        recv = [q for q in Q if q != o]
        j0 = 0
        for n in sizes:
            jg = o * m_hb.mat.n_cb + j0
            lsb, _ = ctx.ext(m_ext, Target.WLSB, j0, n, Q, "up/gate LSB")
            scl_x, _ = ctx.ext(m_ext, Target.WSCALE, j0, n, recv, "up/gate scales")
            msb, a_m = m_hb.load(Target.WMSB, j0, n)
            scl, a_s = m_hb.load(Target.WSCALE, j0, n)
            loads = [(Target.WMSB, msb, Source.HB, a_m)]
            if o in Q:
                loads.append((Target.WLSB, lsb, Source.EXT, 0))
            loads.append((Target.WSCALE, scl, Source.HB, a_s))
            own = B[o].job(loads)
            theirs = {q: B[q].job([(Target.WLSB, lsb, Source.EXT, 0),
                                   (Target.WSCALE, scl_x, Source.EXT, 0)]) for q in recv}
            for s0, k in _steps(n, step):
                for q in recv:
                    B[o].gemm(own, mode=Mode.MSB_ONLY, act_base=sl[q][0] * Gu, w_base=s0 * Gu,
                              row_blocks=rbs[q], col_blocks=k, groups=Gu, sink=Sink.RAW,
                              tok_base=sl[q][0] * R)
                    ctx.ops.append(LinkOp(LinkMode.BYPASS, 1 << o, 1 << q,
                                          k * rbs[q] * ctx.wpr))
                for q in recv:
                    B[q].gemm(theirs[q], mode=Mode.LSB_ONLY, act_base=sl[q][0] * Gu,
                              w_base=s0 * Gu, row_blocks=rbs[q], col_blocks=k, groups=Gu,
                              sink=Sink.SWIGLU, out_base=(jg + s0) * L // 2,
                              tok_base=sl[q][0] * R, stride=I // pe.q16_per_word,
                              psum_in=True)
                ctx.steps += 1
            if o in Q:
                B[o].gemm(own, mode=Mode.FULL, act_base=sl[o][0] * Gu, w_base=0,
                          row_blocks=rbs[o], col_blocks=n, groups=Gu, sink=Sink.SWIGLU,
                          out_base=jg * L // 2, tok_base=sl[o][0] * R,
                          stride=I // pe.q16_per_word)
            j0 += n
    for q in Q:
        B[q].cmd("requant", row_blocks=rbs[q], channels=I, act_base=0, tok_base=sl[q][0] * R)
    # scatter of the INT8 h rows: token owner q -> every PE's K slice (ALL_TO_ALL, chunk =
    # one row block's K slice), in steps of at most buffer_words words per destination
    if Gp > ctx.buffer_words:
        raise ValueError(f"buffer_words: {ctx.buffer_words} words cannot hold one row block's "
                         f"K slice of h ({Gp} words)")
    step_rb = ctx.buffer_words // Gp
    for q in Q:
        for k0 in range(0, rbs[q], step_rb):
            k = min(step_rb, rbs[q] - k0)
            ctx.ops.append(LinkOp(LinkMode.ALL_TO_ALL, 1 << q, _mask(range(G)), k * Ga,
                                  chunk=Gp))
            B[q].cmd("send", target=Target.ACT, addr=k0 * Ga, words=k * Ga)
            for p in range(G):
                B[p].cmd("recv", target=Target.ACT, addr=ha[p] + (sl[q][0] + k0) * Gp,
                         words=k * Gp)
            ctx.steps += 1
    # down: per buffer-full, MSB_ONLY on each PE's K slice for every token slice (REDUCE_ADD
    # to the token owner) and LSB_ONLY over all of K on the token owner with psum_in, into
    # COMBINE; link steps of at most buffer_words words per destination
    dn_hb0, dn_ext = pl["dn_hb"][0].mat, pl["dn_ext"]
    al = dn_hb0.align * dn_ext.mat.align // math.gcd(dn_hb0.align, dn_ext.mat.align)
    sizes_d = _cuts(dn_ext.mat.n_cb, pe.wmem_words // Ga, al, "down chunk (WMEM buffer)")
    step = ctx.cap(max(rbs), "the down projection")
    j0 = 0
    for n in sizes_d:
        lsb, _ = ctx.ext(dn_ext, Target.WLSB, j0, n, Q, "down LSB")
        scl_x, _ = ctx.ext(dn_ext, Target.WSCALE, j0, n, Q, "down scales")
        ja, jb = {}, {}
        for p in range(G):
            m = pl["dn_hb"][p]
            msb, a_m = m.load(Target.WMSB, j0, n)
            scl, a_s = m.load(Target.WSCALE, j0, n)
            ja[p] = B[p].job([(Target.WMSB, msb, Source.HB, a_m),
                              (Target.WSCALE, scl, Source.HB, a_s)])
            if p in Q:
                jb[p] = B[p].job([(Target.WLSB, lsb, Source.EXT, 0),
                                  (Target.WSCALE, scl_x, Source.EXT, 0)])
        for s0, k in _steps(n, step):
            for p in range(G):
                for q in Q:
                    B[p].gemm(ja[p], mode=Mode.MSB_ONLY, act_base=ha[p] + sl[q][0] * Gp,
                              w_base=s0 * Gp, row_blocks=rbs[q], col_blocks=k, groups=Gp,
                              sink=Sink.RAW, tok_base=sl[q][0] * R)
                if p in Q:
                    B[p].gemm(jb[p], mode=Mode.LSB_ONLY, act_base=0, w_base=s0 * Ga,
                              row_blocks=rbs[p], col_blocks=k, groups=Ga, sink=Sink.COMBINE,
                              out_base=(j0 + s0) * L, tok_base=sl[p][0] * R,
                              stride=H // pe.q24_per_word, psum_in=True)
            for q in Q:
                ctx.ops.append(LinkOp(LinkMode.REDUCE_ADD, _mask(range(G)), 1 << q,
                                      k * rbs[q] * ctx.wpr))
            ctx.steps += 1
        j0 += n
    return {"token_slices": sl, "up_chunks": sizes_u, "down_chunks": sizes_d}


def _verify_uncached(ctx: _Ctx, pl, rbn, prologue) -> dict:
    """Verify of an expert outside HB: streamed whole from EXT (FULL), the weights multicast
    to the PEs holding tokens of it, DP over row blocks, no exchange."""
    pe, G, H, I, B = ctx.pe, ctx.G, ctx.H, ctx.I, ctx.builds
    L, R, Gu, Ga = pe.lanes, pe.rows, H // GROUP, I // GROUP
    sl = _slices(rbn, G, ctx.rotate)
    ctx.rotate += rbn % G
    rbs = [r1 - r0 for r0, r1 in sl]
    Q = [q for q in range(G) if rbs[q]]
    _fits(f"x rows and h rows of {rbn} row blocks (ACT)", max(rbn * Gu, max(rbs) * Ga),
          pe.act_words, ctx.expert)
    _fits(f"HBUF rows up to {rbn * R} of {I} channels", rbn * R * I // pe.q16_per_word,
          pe.hbuf_words, ctx.expert)
    for q in Q:
        B[q].prologue = prologue
    out = {"token_slices": sl}
    for key, per, sink in (("ug_ext", pe.wmem_words // Gu, Sink.SWIGLU),
                           ("dn_ext", pe.wmem_words // Ga, Sink.COMBINE)):
        m = pl[key]
        name = "up/gate" if key == "ug_ext" else "down"
        sizes = _cuts(m.mat.n_cb, per, m.mat.align, f"{name} chunk (WMEM buffer)")
        out["up_chunks" if key == "ug_ext" else "down_chunks"] = sizes
        j0 = 0
        for n in sizes:
            loads = []
            for t in (Target.WMSB, Target.WLSB, Target.WSCALE):
                words, _ = ctx.ext(m, t, j0, n, Q, f"{name} {t.name[1:]} (uncached)")
                loads.append((t, words, Source.EXT, 0))
            for q in Q:
                job = B[q].job(loads)
                if sink is Sink.SWIGLU:
                    B[q].gemm(job, mode=Mode.FULL, act_base=sl[q][0] * Gu, w_base=0,
                              row_blocks=rbs[q], col_blocks=n, groups=Gu, sink=Sink.SWIGLU,
                              out_base=j0 * L // 2, tok_base=sl[q][0] * R,
                              stride=I // pe.q16_per_word)
                else:
                    B[q].gemm(job, mode=Mode.FULL, act_base=0, w_base=0, row_blocks=rbs[q],
                              col_blocks=n, groups=Ga, sink=Sink.COMBINE, out_base=j0 * L,
                              tok_base=sl[q][0] * R, stride=H // pe.q24_per_word)
            j0 += n
        if sink is Sink.SWIGLU:
            for q in Q:
                B[q].cmd("requant", row_blocks=rbs[q], channels=I, act_base=0,
                         tok_base=sl[q][0] * R)
    return out


# ---- link schedule check (word level, FIFO bound) ---------------------------------------------

def link_actions(pe: PEConfig, program) -> list:
    """The link words a PE program moves, in execute order: ``(kind, words, command index)``
    with kind ``"out"`` (``link_o``: SEND, a RAW GEMM's results) or ``"in"`` (``link_i``:
    RECV, a ``psum_in`` GEMM's results); a GEMM with both alternates per result; a GEMM
    with ``acc_hold`` moves none."""
    wpr = pe.rows * pe.lanes // pe.q24_per_word
    acts = []
    for i, cmd in enumerate(program):
        f = cmd.fields
        if cmd.op is Op.SEND:
            acts.append(("out", f["words"], i))
        elif cmd.op is Op.RECV:
            acts.append(("in", f["words"], i))
        elif cmd.op is Op.GEMM and not f.get("acc_hold"):      # a held GEMM emits nothing
            nres = f["col_blocks"] * (2 if Mode(f["mode"]) is Mode.FULL else 1) * f["row_blocks"]
            pin, raw = bool(f["psum_in"]), Sink(f["sink"]) is Sink.RAW
            if pin and raw:
                for _ in range(nres):
                    acts += [("in", wpr, i), ("out", wpr, i)]
            elif pin:
                acts.append(("in", nres * wpr, i))
            elif raw:
                acts.append(("out", nres * wpr, i))
    return acts


class _OpState:
    """Progress of the link's current descriptor on the word-level FIFO model, with the RTL's
    acceptance rules (:class:`elmoe3d.hw.agg_link.AggregationLink`): a word moves only when
    every destination FIFO it goes to has room; ALL_TO_ALL: a destination takes chunks in the
    golden order ((chunk round, source) ascending), so a source's word moves only when its
    destination has reached it; REDUCE: word k moves when every source offers its word k."""

    def __init__(self, op: LinkOp, occ, ready, cap):
        self.op, self.occ, self.ready, self.cap = op, occ, ready, cap
        self.srcs, self.dsts = op.srcs, op.dsts
        self.sent = {s: 0 for s in self.srcs}
        self.reduce = op.mode in (LinkMode.REDUCE_ADD, LinkMode.REDUCE_MAX)
        if op.mode == LinkMode.ALL_TO_ALL:
            self.next = {d: 0 for d in self.dsts}       # next word index in d's order

    def complete(self) -> bool:
        return all(v >= self.op.words for v in self.sent.values())

    def room(self, dsts, n) -> int:
        return min([n] + [self.cap - self.occ[d] for d in dsts])

    def deliver(self, dsts, n):
        for d in dsts:
            self.occ[d] += n
            self.ready[d] += n

    def offer(self, s, n) -> int:
        """Source ``s`` (BYPASS, ALL_TO_ALL) offers up to ``n`` words; returns the number the
        link accepts."""
        op, k = self.op, self.sent[s]
        n = min(n, op.words - k)
        if n <= 0:
            return 0
        if op.mode == LinkMode.BYPASS:
            n = self.room(self.dsts, n)
            self.deliver(self.dsts, n)
            self.sent[s] = k + n
            return n
        c, nd, ns = op.chunk, len(self.dsts), len(self.srcs)
        j = k // c
        d = self.dsts[j % nd]
        idx = (j // nd) * ns * c + self.srcs.index(s) * c + k % c
        if self.next[d] != idx:
            return 0
        n = self.room([d], min(n, c - k % c))
        self.deliver([d], n)
        self.next[d] += n
        self.sent[s] = k + n
        return n

    def collective(self, offers) -> int:
        """REDUCE: every source offers ``offers[s]`` words; returns the words moved."""
        k = next(iter(self.sent.values()))
        n = min([self.op.words - k] + [offers[s] for s in self.srcs])
        n = self.room(self.dsts, n)
        if n > 0:
            self.deliver(self.dsts, n)
            for s in self.srcs:
                self.sent[s] = k + n
        return max(n, 0)


#: Depth (W-bit words) of each PE's EXT FIFO in the die's load router assumed by
#: :func:`check_link_schedule` (``hw.load_router.LoadRouter``'s default ``ext_fifo_words``).
DEFAULT_EXT_FIFO_WORDS = 8
#: Largest EXT chunk (words) the die's EXT scheduler admits at once: the die's default
#: ``ext_chunk_words``, :data:`elmoe3d.config.EXT_CHUNK_WORDS` (defined there once).
DEFAULT_EXT_CHUNK_WORDS = EXT_CHUNK_WORDS


def _cmd_actions(pe, program) -> dict:
    """Command index -> its link actions ``[kind, words]`` (:func:`link_actions`)."""
    out = {}
    for kind, n, i in link_actions(pe, program):
        out.setdefault(i, []).append([kind, n])
    return out


class _PEModel:
    """One PE's two engines on the schedule model: the load engine (LOADs in order: a fence
    waits for every earlier execute command, a WMEM load for its buffer's flag to be clear, an
    EXT load for ring words; ``signal`` sets the flag when the load completes) and the execute
    engine (commands in order: a GEMM with ``wait`` waits for its buffer's flag, moves its link
    words, then ``release`` clears the flag; a BARRIER waits for every earlier LOAD)."""

    def __init__(self, pe, program, ext, log=None, index=0):
        cmds = list(program)
        self.log, self.index = log, index       # EXT LOAD starts, for ``ext_log``
        self.cmds = cmds
        self.loads = [i for i, c in enumerate(cmds) if c.op is Op.LOAD]
        self.execs = [i for i, c in enumerate(cmds) if c.op is not Op.LOAD]
        barrier, self.barrier_before = -1, {}
        for i, c in enumerate(cmds):
            if c.op is Op.BARRIER:
                barrier = i
            elif c.op is Op.LOAD:
                self.barrier_before[i] = barrier
        self.acts = _cmd_actions(pe, cmds)
        self.ext = ext                      # model EXT words (ring) or take them as free
        self.lpos = self.epos = 0
        self.lleft = None                   # EXT words the current LOAD still needs
        self.cur = None                     # link actions left of the current execute command
        self.started = False
        self.full = [False, False]

    def next_exec(self) -> int:
        return self.execs[self.epos] if self.epos < len(self.execs) else 1 << 62

    def next_load(self) -> int:
        return self.loads[self.lpos] if self.lpos < len(self.loads) else 1 << 62

    def done(self) -> bool:
        return self.lpos >= len(self.loads) and self.epos >= len(self.execs)

    def load_step(self, ext_words) -> tuple:
        """Advance the load engine once; returns (progressed, EXT words taken)."""
        if self.lpos >= len(self.loads):
            return False, 0
        i = self.loads[self.lpos]
        f = self.cmds[i].fields
        if (f["fence"] and self.next_exec() < i) or self.next_exec() <= self.barrier_before[i]:
            return False, 0
        target = Target(f["target"])
        wmem = target in (Target.WMSB, Target.WLSB, Target.WSCALE)
        if self.lleft is None:
            if wmem and self.full[f["buf"]]:
                return False, 0
            self.lleft = f["words"] if (self.ext and f["src"] == Source.EXT) else 0
            if f["src"] == Source.EXT and self.log is not None:
                self.log.append(self.index)
        took = min(self.lleft, ext_words)
        self.lleft -= took
        if self.lleft:
            return took > 0, took
        if wmem and f["signal"]:
            self.full[f["buf"]] = True
        self.lpos += 1
        self.lleft = None
        return True, took

    def waiting(self) -> str:
        parts = []
        if self.lpos < len(self.loads):
            i = self.loads[self.lpos]
            f = self.cmds[i].fields
            parts.append(f"load engine at command {i} (LOAD {Target(f['target']).name} "
                         f"{Source(f['src']).name}"
                         + (f", {self.lleft} EXT words missing" if self.lleft else "") + ")")
        if self.epos < len(self.execs):
            i = self.execs[self.epos]
            c = self.cmds[i]
            what = c.op.name
            if self.cur:
                kind, n = self.cur[0]
                what += f", {'sending' if kind == 'out' else 'receiving'} {n} link words"
            elif c.op is Op.GEMM and c.fields["wait"] and not self.started:
                what += f", waiting for buffer {c.fields['wbuf']}"
            parts.append(f"execute engine at command {i} ({what})")
        return "; ".join(parts) or "finished"


def check_link_schedule(job_or_programs, link_ops=None, *, buffer_words=None, pe=None,
                        ext_transfers=None, ext_fifo_words=DEFAULT_EXT_FIFO_WORDS,
                        ext_chunk_words=DEFAULT_EXT_CHUNK_WORDS, ext_window: int = 1,
                        ext_log: list | None = None) -> dict:
    """Run a group's programs on a timing-free model of the PEs' engines, the aggregation link
    and the streamline ring, word by word, and fail on any schedule that would deadlock.

    * Each PE: a load engine and an execute engine (:class:`_PEModel`: buffer flags, fences,
      BARRIER); the execute engine moves a command's link words (:func:`link_actions`) in
      order.
    * The link runs its descriptors one at a time in order; each destination has a FIFO of
      ``buffer_words`` words; a source's word moves when every FIFO it goes to has room and,
      in ALL_TO_ALL, when its destination has reached that (chunk, source) in the golden order;
      a reduction's word k moves when every source offers it (the RTL's rules,
      :class:`elmoe3d.hw.agg_link.AggregationLink`). A read waits for a word. The model counts
      words, not cycles: the RTL's latencies (:data:`~elmoe3d.config.LINK_OP_LATENCY`,
      :func:`~elmoe3d.config.link_latency`) come from its two-flit source buffers and its
      reduction tree, flits in flight between a source and its destinations; that buffering
      lets a source go on earlier than here and never holds one the model lets go, so the
      model without it is the stricter of the two.
    * The ring delivers ``ext_transfers`` by the die's EXT admission rule
      (:func:`elmoe3d.sw.golden.ext_sched.ext_pick`, the RTL's
      :class:`elmoe3d.hw.ext_sched.ExtScheduler`): of a window of the oldest ``ext_window``
      transfers not fully sent, the oldest that shares no PE with an older one and whose PEs
      all have room for its next chunk (``min(words left, ext_chunk_words)``) in their EXT
      FIFOs of ``ext_fifo_words`` words (the load router's FIFO, the scheduler's credits)
      sends that chunk, a multicast chunk to all its destinations at once; the PEs' EXT LOADs
      drain the FIFOs in order. Each group of the die has its own EXT queue and scheduler, so
      this is the group's rule exactly with ``ext_window`` = the die's ``ext_window``; the
      default 1 is the strictest (in order). Without transfers (a list of programs) EXT words
      are taken as always available. HB and HOST words always are.

    Parameters
    ----------
    job_or_programs : GroupJob, or a list of Program (then pass ``link_ops``,
        ``buffer_words``)
    buffer_words : int, optional
        Link FIFO depth (default: the job's).
    ext_fifo_words : int
    ext_chunk_words : int
        <= ``ext_fifo_words``.
    ext_window : int
        Transfers the admission rule may choose among (>= 1).

        The defaults are the strictest schedule, not a die's: to check a job for a die, pass
        that die's ``ext_fifo_words``, ``ext_chunk_words`` and ``ext_window`` from
        :meth:`elmoe3d.hw.die.LogicDie.host_figures` (computed from the die's parameters
        without building it).
    ext_log : list, optional
        Appended ``p`` each time PE p's load engine starts an EXT LOAD: with EXT words always
        available, the order in which a ring could serve the PEs' EXT LOADs (a compiler's
        ring order, ``elmoe3d.sw.host.stream_group``).

    Returns ``{"max_fifo_words": [per PE], "max_ext_fifo_words": [per PE], "link_words": n}``.

    Raises
    ------
    LinkScheduleError
        A deadlock (what every engine, the link and the ring wait for), words that no
        descriptor takes, a descriptor whose sources send too few words, words nobody reads.
    """
    if isinstance(job_or_programs, GroupJob):
        job = job_or_programs
        programs, link_ops, pe = job.programs, job.link_ops, job.pe
        buffer_words = job.buffer_words if buffer_words is None else buffer_words
        ext_transfers = job.ext_transfers if ext_transfers is None else ext_transfers
    else:
        programs = job_or_programs
        if link_ops is None or buffer_words is None:
            raise TypeError("check_link_schedule: pass link_ops= and buffer_words= with a list "
                            "of programs")
        pe = programs[0].pe if pe is None else pe_config(pe)
    cap = check_int("buffer_words", buffer_words, 1)
    ext_cap = check_int("ext_fifo_words", ext_fifo_words, 1)
    ext_cw = check_int("ext_chunk_words", ext_chunk_words, 1)
    ext_win = check_int("ext_window", ext_window, 1)
    if ext_cw > ext_cap:
        raise ValueError(f"ext_chunk_words: {ext_cw} exceeds ext_fifo_words ({ext_cap})")
    G = len(programs)
    for op in link_ops:
        op.check(G)
    ring = list(ext_transfers or ())
    pes = [_PEModel(pe, prog, ext_transfers is not None, ext_log, p)
           for p, prog in enumerate(programs)]
    occ, ready = [0] * G, [0] * G
    ext_occ = [0] * G
    peak, ext_peak = [0] * G, [0] * G
    d = 0
    cur = _OpState(link_ops[0], occ, ready, cap) if link_ops else None
    head, window = 0, []        # next transfer to enter the window; [addr, left, mask]
    moved = 0

    def exec_step(m: _PEModel, p) -> bool:
        """Advance PE p's execute engine as far as it goes; True on progress."""
        nonlocal moved
        progress = False
        while m.epos < len(m.execs):
            i = m.execs[m.epos]
            c = m.cmds[i]
            if m.cur is None:
                if c.op is Op.BARRIER and m.next_load() < i:
                    return progress
                if c.op is Op.GEMM and c.fields["wait"] and not m.started:
                    if not m.full[c.fields["wbuf"]]:
                        return progress
                m.started = True
                m.cur = [list(a) for a in m.acts.get(i, [])]
            while m.cur:
                kind, n = m.cur[0]
                if kind == "in":
                    k = min(n, ready[p])
                    ready[p] -= k
                    occ[p] -= k
                else:
                    if cur is None or p not in cur.sent or cur.reduce:
                        k = 0
                    else:
                        k = cur.offer(p, n)
                        moved += k
                        for q in range(G):
                            peak[q] = max(peak[q], occ[q])
                if k == 0:
                    return progress
                progress = True
                m.cur[0][1] -= k
                if m.cur[0][1] == 0:
                    m.cur.pop(0)
            if c.op is Op.GEMM and c.fields["release"]:
                m.full[c.fields["wbuf"]] = False
            m.cur, m.started = None, False
            m.epos += 1
            progress = True
        return progress

    while True:
        progress = False
        # the ring: chunks admitted by the die's rule go to all their destinations at once
        while True:
            while len(window) < ext_win and head < len(ring):
                if ring[head].words:
                    window.append([ring[head].addr, len(ring[head].words), ring[head].dst_mask])
                head += 1
            pick = ext_pick(window, [ext_cap - o for o in ext_occ], ext_cw)
            if pick is None:
                break
            i, n = pick
            for q in range(G):
                if window[i][2] >> q & 1:
                    ext_occ[q] += n
                    ext_peak[q] = max(ext_peak[q], ext_occ[q])
            window[i][0] += n
            window[i][1] -= n
            if not window[i][1]:
                del window[i]
            progress = True
        for p, m in enumerate(pes):
            while True:
                ok, took = m.load_step(ext_occ[p])
                ext_occ[p] -= took
                progress |= ok
                if not ok or m.lpos >= len(m.loads):
                    break
            progress |= exec_step(m, p)
        if cur is not None and cur.reduce:
            offers = {}
            for s in cur.srcs:
                m = pes[s]
                offers[s] = m.cur[0][1] if m.cur and m.cur[0][0] == "out" else 0
            n = cur.collective(offers)
            if n:
                for s in cur.srcs:
                    m = pes[s]
                    m.cur[0][1] -= n
                    moved += n
                    if m.cur[0][1] == 0:
                        m.cur.pop(0)
                for q in range(G):
                    peak[q] = max(peak[q], occ[q])
                progress = True
        while cur is not None and cur.complete():
            d += 1
            cur = _OpState(link_ops[d], occ, ready, cap) if d < len(link_ops) else None
            progress = True
        if all(m.done() for m in pes) and cur is None and head >= len(ring) and not window:
            break
        if not progress:
            waits = [f"PE {p}: {m.waiting()}" for p, m in enumerate(pes)]
            link = ("link idle" if cur is None else
                    f"link at descriptor {d} ({cur.op.mode.name} src {cur.srcs} dst "
                    f"{cur.dsts}, {cur.op.words} words, sent {cur.sent})")
            if all(m.done() for m in pes) and cur is not None:
                raise LinkScheduleError(
                    f"descriptor {d} ({cur.op.mode.name} src {cur.srcs}) waits for words its "
                    f"sources never send (sent {cur.sent} of {cur.op.words})")
            ring_s = (f"ring: {len(window) + len(ring) - head} transfers not sent, window "
                      f"[addr, words left, mask] {window}, EXT FIFO words {ext_occ}"
                      if window or head < len(ring) else "ring idle")
            raise LinkScheduleError(
                f"the group's schedule deadlocks (buffer_words = {cap}, ext_fifo_words = "
                f"{ext_cap}): {' | '.join(waits)} | {link}; link FIFO words {occ} | {ring_s}")
    if any(occ):
        raise LinkScheduleError(f"words delivered but never read: FIFO words per destination "
                                f"{occ}")
    if any(ext_occ):
        raise LinkScheduleError(f"EXT words delivered but never loaded: {ext_occ}")
    return {"max_fifo_words": peak, "max_ext_fifo_words": ext_peak, "link_words": moved}


# ---- multi-PE functional simulation -----------------------------------------------------------

@dataclass(eq=False)
class GroupResult:
    """Result of :func:`run_group`.

    Attributes
    ----------
    y : float32 ``[T, H]``
        The root's OUTPUT.
    out : int64 ``[T, H]``
        The root's Q.24 sums (OUT); None for a job whose OUT holds one chunk at a time
        (:class:`~elmoe3d.sw.host.stream_group.StreamGroupJob`).
    acc_overflow, vpu_saturation : bool
        OR of every PE's sticky flags (their STATUS beats).
    statuses : list of dict
        Each PE's STATUS fields.
    o : list of list of OBeat
        Each PE's ``o`` beats in order (the root: DATA then STATUS; the others: STATUS), what
        an RTL bench compares beat for beat.
    link_o : list of list of int
        Each PE's ``link_o`` words in order.
    states : list of PEState
    link_words : int
        Words the sources put on the link (functional run).
    schedule : dict
        :func:`check_link_schedule`'s figures.
    phases : int
        Rounds of the phase loop (runs of each PE up to a link exchange).
    """

    y: np.ndarray
    out: np.ndarray
    acc_overflow: bool
    vpu_saturation: bool
    statuses: list
    o: list
    link_o: list
    states: list
    link_words: int
    schedule: dict
    phases: int


def _link_in_words(pe, program) -> list:
    """``link_i`` words each command of ``program`` takes (:func:`link_actions`)."""
    need = [0] * len(program)
    for kind, n, i in link_actions(pe, program):
        if kind == "in":
            need[i] += n
    return need


def run_group(job: GroupJob) -> GroupResult:
    """Run a group's programs on the functional simulator, one
    :class:`~elmoe3d.sw.golden.pe.PEState` per PE, joined by the golden aggregation link.

    First :func:`check_link_schedule` (a deadlock or a FIFO overflow raises
    :class:`LinkScheduleError`). Then phases: each PE runs, on its own state, every next
    command whose ``link_i`` words have arrived (:func:`elmoe3d.sw.golden.pe.run` with ``state=``);
    then every descriptor whose sources have put out all their words runs through
    :func:`elmoe3d.sw.golden.agg_link.ref_link` and its words join the destinations' ``link_i``;
    until every program and descriptor is done (no progress raises :class:`LinkScheduleError`).
    """
    sched = check_link_schedule(job)
    pe, G = job.pe, job.pes
    cmds = [[c.encode() for c in prog] for prog in job.programs]
    need = [_link_in_words(pe, prog) for prog in job.programs]
    states = [fsim.PEState.reset(pe) for _ in range(G)]
    pos, ld_pos, in_pos, out_pos = [0] * G, [0] * G, [0] * G, [0] * G
    inbox = [[] for _ in range(G)]
    outbox = [[] for _ in range(G)]
    obeats = [[] for _ in range(G)]
    d = 0
    phases = 0
    moved = 0
    while True:
        progress = False
        for p in range(G):
            avail = len(inbox[p]) - in_pos[p]
            end, n_in = pos[p], 0
            while end < len(cmds[p]) and n_in + need[p][end] <= avail:
                n_in += need[p][end]
                end += 1
            if end == pos[p]:
                continue
            res = fsim.run(cmds[p][pos[p]:end], job.ld[p][ld_pos[p]:], inbox[p][in_pos[p]:],
                           config=pe, state=states[p])
            assert res.link_i_used == n_in, (p, res.link_i_used, n_in)
            ld_pos[p] += res.ld_used
            in_pos[p] += n_in
            outbox[p].extend(res.link_o)
            obeats[p].extend(res.o)
            pos[p] = end
            progress = True
        while d < len(job.link_ops):
            op = job.link_ops[d]
            if any(len(outbox[s]) - out_pos[s] < op.words for s in op.srcs):
                break
            got = ref_link(op, [outbox[s][out_pos[s]:out_pos[s] + op.words] for s in range(G)],
                           word_bits=pe.word_bits)
            for s in op.srcs:
                out_pos[s] += op.words
                moved += op.words
            for q in range(G):
                inbox[q].extend(got[q])
            d += 1
            progress = True
        phases += 1
        if all(pos[p] == len(cmds[p]) for p in range(G)) and d == len(job.link_ops):
            break
        if not progress:
            raise LinkScheduleError(
                f"the functional run makes no progress at descriptor {d}: PEs at commands "
                f"{pos}, link words waiting per PE {[len(inbox[p]) - in_pos[p] for p in range(G)]}")
    for p in range(G):
        if ld_pos[p] != len(job.ld[p]):
            raise ProgramError(f"PE {p}: the program consumed {ld_pos[p]} of {len(job.ld[p])} "
                               f"ld words")
        if out_pos[p] != len(outbox[p]) or in_pos[p] != len(inbox[p]):
            raise LinkScheduleError(f"PE {p}: {len(outbox[p]) - out_pos[p]} link_o words no "
                                    f"descriptor took, {len(inbox[p]) - in_pos[p]} link_i "
                                    f"words never read")
    root = job.root
    data = [b.data for b in obeats[root] if b.kind is OKind.DATA]
    y = job.decode(fsim.FsimResult(o=obeats[root], link_o=[], state=states[root]).data()
                   if data else np.zeros((0, job.hidden), np.float32))
    statuses = [fsim.FsimResult(o=obeats[p], link_o=[], state=states[p]).statuses()[-1]
                for p in range(G)]
    out = job.root_out(states[root])
    return GroupResult(y=y, out=out,
                       acc_overflow=any(s["acc_overflow"] for s in statuses),
                       vpu_saturation=any(s["vpu_saturation"] for s in statuses),
                       statuses=statuses, o=obeats, link_o=outbox, states=states,
                       link_words=moved, schedule=sched,
                       phases=phases)
