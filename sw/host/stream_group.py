"""One real-shape expert on a PE group: tensor parallelism over the intermediate dimension with
the streamed expert program on every PE (paper Sections 5.1 and 5.2; ``docs/pe.md`` "Real
expert shapes", ``docs/parallel.md``).

A real expert does not fit one paper-size PE (32 KB IOMEM: ``docs/pe.md``); split over the G PEs
of an aggregation-link group it does:

* **up/gate, channel slices**: PE p computes the intermediate channels
  ``[p I_p, (p+1) I_p)``, ``I_p = I_pad / G``; I is padded with zero channels to a multiple of
  G x lcm(W/32, 32, L/2) (zero up, gate and down weights: h = 0, no contribution; exact);
* **row max, all-reduce**: after its max pass every PE puts its row maxima on the link
  (``SEND ROWMAX``), the link's REDUCE_MAX returns the maximum to every PE
  (``RECV ROWMAX accumulate``), so every PE requantizes its slice with the full row's
  exponent, as one PE would;
* **down, K slices**: PE p's down GEMMs run over its K slice (its own h codes) for every
  output column block; the members' psums go out RAW, the link's REDUCE_ADD sums them into the
  root's ``psum_in``, and the root adds its own, COMBINEs and OUTPUTs (Q.24 sums are exact:
  the split equals one PE bit for bit).

Every PE streams its own slice of the weights once per token tile (from its HB bank) and x
(replicated, from the host). :func:`compile_expert_group` returns a
:class:`~elmoe3d.sw.host.parallel.GroupJob` that :func:`~elmoe3d.sw.host.parallel.run_group`
runs on the functional simulator.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...checks import is_int
from ...config import ArchConfig, PEConfig
from ...isa import Op, Source
from ..golden.agg_link import LinkMode, LinkOp
from ..golden.asm import OKind, ProgramError, ints_to_words, unpack_q24
from ..golden.datapath import Mode
from ..golden.datapath import saturating_add
from ..golden.expert import (Expert, _gate_bits, _mode, as_expert, as_experts, check_x,
                             expert_tokens, parse_routing)
from ..golden.vpu import q24_to_fp32
from ..golden.expert_stream import (Placement, WeightImage, place_chunks, plan_expert_stream,
                                    stream_pe_program)
from ..golden.quant import QuantizedWeight, quantize_activations
from .parallel import (DEFAULT_BUFFER_WORDS, ExtTransfer, GroupJob, ext_load_order,
                       group_pe)


__all__ = ["StreamGroupJob", "compile_expert_group", "plan_group", "slice_step",
           "fitting_group", "fitting_split", "fitting_config", "MAX_LINK_PES",
           "padded_intermediate",
           "DieExpert", "StreamDieJob", "DieResult", "compile_moe_die"]


def slice_step(pe: PEConfig) -> int:
    """Channels a PE's intermediate slice is a multiple of: whole HBUF words (W/32), whole
    REQUANT groups (32) and whole up/gate column blocks (L/2)."""
    return int(np.lcm.reduce([pe.q16_per_word, 32, pe.lanes // 2]))


def padded_intermediate(intermediate: int, pes: int, pe: PEConfig) -> int:
    """I padded with zero channels to a multiple of ``pes`` x :func:`slice_step`."""
    unit = pes * slice_step(pe)
    return -(-int(intermediate) // unit) * unit


#: The most PEs one aggregation link joins (its descriptors' 16-bit PE masks).
MAX_LINK_PES = 16


def fitting_group(hidden: int, intermediate: int, config: ArchConfig,
                  raw_output: bool | None = None) -> int | None:
    """The smallest aggregation-group size G (a divisor of ``config.pes``, at most
    :data:`MAX_LINK_PES`) whose PEs hold an expert of shape ``hidden`` x ``intermediate`` split
    over them (:func:`plan_group`), or None when no group of the die's PEs does. With the
    paper PE (32 KB IOMEM, 16-row tile): 4 for the 2048-hidden presets, 8 for GPT-OSS-20B
    (2880 x 2880), none for Mixtral-8x7B (4096 x 14336: a 16-token tile's h codes, 16 x 14336
    bytes, would need every ACT word of 32 PEs and I in 448-channel slices, not whole HBUF
    words)."""
    for G in range(1, min(config.pes, MAX_LINK_PES) + 1):
        if config.pes % G:
            continue
        try:
            plan_group(hidden, intermediate, config.pe, G, raw_output)
        except ProgramError:
            continue
        return G
    return None


def fitting_split(hidden: int, intermediate: int, config: ArchConfig, pes: int,
                  raw_output: bool | None = None) -> tuple | None:
    """The IOMEM split (``ArchConfig.iomem_split``: ACT, TOK, HBUF, OUT in 32nds) under which
    ``pes`` PEs of ``config`` hold an expert of shape ``hidden`` x ``intermediate``
    (:func:`plan_group`), or None when no split does. Of the splits that fit, the one with
    the fewest passes over up/gate, then x resident rather than streamed, then the widest x
    slots (the K groups of a streamed x chunk bound a buffer-full's), then the widest OUT
    chunk, then the first in lexicographic order: the weights stream the fewest times, in
    the fewest buffer-fulls. A
    design-space answer (a PE built with that split), not a program option: the split is the
    hardware's memory sizes."""
    import dataclasses
    words = config.pe.act_words + config.pe.tok_words + config.pe.hbuf_words + \
        config.pe.out_words
    best = None
    for act in range(1, 30):
        for tok in range(1, 31 - act):
            for hbuf in range(1, 32 - act - tok):
                split = (act, tok, hbuf, 32 - act - tok - hbuf)
                a, t, h = (words * v // 32 for v in split[:3])
                pe = dataclasses.replace(config.pe, act_words=a, tok_words=t, hbuf_words=h,
                                         out_words=words - a - t - h)
                try:
                    plan, _, _ = plan_group(hidden, intermediate, pe, pes, raw_output)
                except ProgramError:
                    continue
                key = (plan.passes, plan.x_stream, -plan.x_chunk, -plan.out_chunk, split)
                if best is None or key < best:
                    best = key
    return None if best is None else best[-1]


def fitting_config(hidden: int, intermediate: int, config: ArchConfig) -> ArchConfig | None:
    """``config`` itself when its aggregation group holds an expert of shape ``hidden`` x
    ``intermediate``; else the nearest configuration that does, changing as little hardware as
    possible: the smallest group (:func:`fitting_group`, ``pes_per_group``) with the same
    IOMEM split; else the same group with the IOMEM split of :func:`fitting_split`; else the
    smallest group with a split that fits. The name says what changed (``mid-io29_1_1_1``,
    ``paper-4gb-g8``). None when no group of the die's PEs holds it under any split."""
    import dataclasses

    def fits(cfg):
        try:
            plan_group(hidden, intermediate, cfg.pe, cfg.pes_per_group)
        except ProgramError:
            return False
        return True

    def named(cfg, g=None, split=None):
        name = cfg.name + (f"-g{g}" if g else "") + (
            "-io" + "_".join(map(str, split)) if split else "")
        return dataclasses.replace(cfg, name=name, pes_per_group=g or cfg.pes_per_group,
                                   iomem_split=split or cfg.iomem_split)

    if fits(config):
        return config
    g = fitting_group(hidden, intermediate, config)
    if g is not None:
        return named(config, g=g)
    split = fitting_split(hidden, intermediate, config, config.pes_per_group)
    if split is not None:
        return named(config, split=split)
    for g in range(1, min(config.pes, MAX_LINK_PES) + 1):
        if config.pes % g == 0:
            split = fitting_split(hidden, intermediate, config, g)
            if split is not None:
                return named(config, g=g, split=split)
    return None


def plan_group(hidden: int, intermediate: int, pe: PEConfig, pes: int,
               raw_output: bool | None = None) -> tuple:
    """``(plan, padded I, raw_output)`` of an expert split over ``pes`` PEs (the checks of
    :func:`compile_expert_group`, before any weight is built): raw outputs by default where OUT
    holds no FP32 OUTPUT chunk. Raises ProgramError naming the memory and the PE count."""
    if raw_output is None:
        fp32_chunk = int(np.lcm(pe.lanes, pe.fp32_per_beat))
        raw_output = pe.out_words < pe.rows * fp32_chunk // pe.q24_per_word
    I_pad = padded_intermediate(intermediate, pes, pe)
    Ip = I_pad // pes
    try:
        plan = plan_expert_stream(hidden, Ip, pe, raw_output=raw_output)
    except ProgramError as e:
        raise ProgramError(f"{e} [with I = {intermediate} padded to {I_pad} over {pes} PEs: "
                           f"{Ip} channels a PE]") from None
    return plan, I_pad, raw_output


def _pad_rows(qw: QuantizedWeight, n: int) -> QuantizedWeight:
    q = np.zeros((n, qw.q.shape[1]), qw.q.dtype)
    q[:len(qw.q)] = qw.q
    sc = np.zeros((n, qw.scale.shape[1]), np.asarray(qw.scale).dtype)
    sc[:len(qw.q)] = qw.scale
    return QuantizedWeight(q=q, scale=sc, name=qw.name)


def _slice(ex: Expert, c0: int, c1: int) -> Expert:
    d = ex.down
    return Expert(QuantizedWeight(q=ex.up.q[c0:c1], scale=ex.up.scale[c0:c1], name=ex.up.name),
                  QuantizedWeight(q=ex.gate.q[c0:c1], scale=ex.gate.scale[c0:c1],
                                  name=ex.gate.name),
                  QuantizedWeight(q=d.q[:, c0:c1], scale=d.scale[:, c0 // 32:c1 // 32],
                                  name=d.name))


@dataclass(eq=False)
class StreamGroupJob(GroupJob):
    """A :class:`~elmoe3d.sw.host.parallel.GroupJob` whose root emits its OUTPUT per token tile
    and OUT chunk (``chunks``: ``(token0, rows, channel0, channels)`` per OUTPUT)."""

    chunks: list = field(default_factory=list)
    raw_output: bool = False

    def decode(self, data: np.ndarray) -> np.ndarray:
        """``float32 [T, H]`` from the root's DATA beats (``[beats, W/32]`` FP32 values; with
        ``raw_output`` the beats' bits are Q.24 values, converted to FP32 here)."""
        if self.raw_output:
            q = np.ascontiguousarray(np.asarray(data, np.float32)).view(np.int64).reshape(-1)
            return q24_to_fp32(self._place(q, np.int64))
        return self._place(np.asarray(data, np.float32).reshape(-1), np.float32)

    def _place(self, vals, dtype):
        return place_chunks(self.chunks, vals, self.tokens, self.hidden, dtype)

    def root_out(self, state):
        return None                    # OUT held one chunk at a time

    def decode_q24(self, obeats) -> np.ndarray:
        """``int64 [T, H]`` Q.24 values from the root's ``o`` beats of a job compiled with
        ``raw_output`` (OUTPUT raw: one OUT word, W/64 values, a beat)."""
        words = [b.data for b in obeats if b.kind is OKind.DATA]
        return self._place(unpack_q24(ints_to_words(words, self.pe), self.pe).reshape(-1),
                           np.int64)

def compile_expert_group(x, expert, gate_weights=None, mode=Mode.FULL, config=None, *,
                         pes: int | None = None, root: int = 0,
                         buffer_words: int = DEFAULT_BUFFER_WORDS,
                         name: str = "expert",
                         raw_output: bool | None = None,
                         lsb_src=Source.HB) -> StreamGroupJob:
    """Programs of a PE group running one expert of a real shape over the tokens of ``x``
    (module docstring), equal bit for bit to :func:`~elmoe3d.sw.golden.expert.ref_moe` of the
    expert alone.

    Parameters
    ----------
    x : float ``[T, H]``
    expert : Expert or ``(w_up, w_gate, w_down)``
    gate_weights : float ``[T]``, optional (default 1)
    mode : Mode.FULL (verify numerics) or Mode.DRAFT
    config : ArchConfig (or PEConfig with ``pes``)
    pes : int, optional
        G (default ``config.pes_per_group``); 1 gives the single-PE program.
    root : int
        The PE that COMBINEs and emits the result.
    buffer_words : int
        The link FIFO depth the schedule is checked against.
    raw_output : bool, optional
        The root emits its Q.24 OUT chunks (OUTPUT raw; :meth:`StreamGroupJob.decode_q24`;
        ``decode`` converts them to FP32 as the PE would) instead of FP32: the expert's partial
        of an MoE layer (:func:`compile_moe_die`). Default: raw where OUT holds no FP32
        OUTPUT chunk (the paper PE: 16 rows of 128 channels would need 32 OUT words).
    lsb_src : Source.HB or Source.EXT
        Where a FULL program's LSB planes come from: the PEs' HB banks beside the MSB planes
        (an expert held whole in HB), or external memory over the streamline ring (the paper's
        placement of an HB-cached expert, Section 5.2: MSB slices and scales in HB, LSB slices
        in EXT; every PE's LSB words a unicast ``ExtTransfer``, interleaved over the PEs in
        the order their programs read them). DRAFT reads no LSB plane. The job's
        ``hb_images``, ``ext_image`` and ``ext_transfers`` hold what each source serves; the
        MSB and scale bytes in HB are the same in DRAFT and FULL.

    Raises
    ------
    ProgramError
        A PE's slice does not fit its memories (the message names the memory and the PE count).
    ValueError
        A bad parameter (named).
    """
    pe, G = group_pe(config, pes)
    if not is_int(G) or not 1 <= G <= MAX_LINK_PES:
        raise ValueError(f"pes: expected 1..{MAX_LINK_PES} PEs (link masks), got {G!r}")
    if not is_int(root) or not 0 <= root < G:
        raise ValueError(f"root: expected a PE index in 0..{G - 1}, got {root!r}")
    G, root = int(G), int(root)
    mode = _mode(mode)
    if mode not in (Mode.FULL, Mode.DRAFT):
        raise ValueError(f"mode: expected FULL or DRAFT, got {mode.name}")
    if lsb_src not in (Source.HB, Source.EXT):
        raise ValueError(f"lsb_src: expected Source.HB or Source.EXT, got {lsb_src!r}")
    ex = as_expert(expert, name)
    x = np.asarray(x)
    T = check_x(x, ex)
    gw = _gate_bits(np.ones(T) if gate_weights is None else gate_weights, T)
    H, I = ex.hidden, ex.intermediate
    try:
        plan, I_pad, raw_output = plan_group(H, I, pe, G, raw_output)
    except ProgramError as e:
        if not isinstance(config, ArchConfig):
            raise
        fit = fitting_group(H, I, config, raw_output)
        raise ProgramError(
            f"{e}; " + (f"a group of {fit} PEs holds it (ArchConfig.pes_per_group = {fit})"
                        if fit else f"no aggregation group of the die's {config.pes} PEs "
                        f"holds it")) from None
    Ip = I_pad // G
    padded = Expert(_pad_rows(ex.up, I_pad), _pad_rows(ex.gate, I_pad),
                    QuantizedWeight(q=_pad_cols(ex.down.q, I_pad),
                                    scale=_pad_cols(ex.down.scale, I_pad // 32),
                                    name=ex.down.name))
    xq = quantize_activations(x, name="x")
    e_x = np.asarray(xq.exp, np.int64)
    if e_x.size and (e_x.min() < -128 or e_x.max() > 127):
        raise ProgramError(f"x: activation exponents {e_x.min()}..{e_x.max()} do not fit the "
                           f"TOK entry's signed 8-bit e_x (scale the input)")
    programs, lds, infos = [], [], []
    chunks = []
    ext = WeightImage() if lsb_src is Source.EXT else None
    places = [Placement(ext=ext, tag=p) for p in range(G)]
    for p in range(G):
        role = "single" if G == 1 else ("root" if p == root else "member")
        prog, ld, info, ch = stream_pe_program(pe, plan, _slice(padded, p * Ip, (p + 1) * Ip),
                                               xq.q, e_x, gw, mode, role=role,
                                               rowmax_exchange=G > 1,
                                               raw_output=raw_output, placement=places[p])
        prog.check_sync()
        programs.append(prog)
        lds.append(ld)
        infos.append(info)
        if p == root:
            chunks = ch
    # the link: per token tile the row-max all-reduce, then one REDUCE_ADD per down column
    # block (the members' RAW psums into the root's psum_in), in the order the programs use them
    ops = []
    if G > 1:
        everyone = (1 << G) - 1
        members = everyone & ~(1 << root)
        wpr = pe.rows * pe.lanes // pe.q24_per_word
        for _ in range(infos[root]["tiles"]):
            ops.append(LinkOp(LinkMode.REDUCE_MAX, everyone, everyone, 1))
            ops.extend(LinkOp(LinkMode.REDUCE_ADD, members, 1 << root, wpr)
                       for _ in range(plan.hidden_out // pe.lanes))
    load_src = []
    for prog in programs:
        src = []
        for i, cmd in enumerate(prog):
            if cmd.op is Op.LOAD:
                src.append((i, Source(cmd.fields["src"]), cmd.fields["hb_addr"],
                            cmd.fields["words"]))
        load_src.append(src)
    info = {"pes": G, "intermediate_padded": I_pad, "slice": Ip, "plan": plan,
            "per_pe": infos}
    # the ring order: as the group's engines start their EXT LOADs with EXT words always at
    # hand (ext_load_order), so a member running ahead to its psum sends does not hold the
    # ring while the root still needs words to drain the link (run_group checks it)
    job = StreamGroupJob(pe=pe, pes=G, phase="draft" if mode is Mode.DRAFT else "verify",
                         mode=mode, programs=programs, ld=lds, load_src=load_src,
                         hb_images=[pl.hb.words for pl in places],
                         ext_image=[] if ext is None else ext.words,
                         ext_transfers=_ext_reads(places, ext),
                         link_ops=ops, root=root, tokens=T, hidden=H,
                         buffer_words=buffer_words, info=info, chunks=chunks,
                         raw_output=raw_output)
    job.ext_transfers = ext_load_order(job)
    return job


def _ext_reads(places, ext) -> list:
    """The PEs' EXT reads as unicast ring transfers, PE by PE in each PE's order (the job then
    puts them in ring order with :func:`~elmoe3d.sw.host.parallel.ext_load_order`)."""
    if ext is None:
        return []
    return [ExtTransfer(addr=addr, words=tuple(ext.words[addr:addr + n]), dst_mask=1 << p,
                        what=what)
            for p, place in enumerate(places) for addr, n, what in place.ext_reads]


def _pad_cols(a, n):
    a = np.asarray(a)
    out = np.zeros((a.shape[0], n), a.dtype)
    out[:, :a.shape[1]] = a
    return out


# ---- an MoE layer on the die: experts over the groups (DP), each split over its group (TP) ----

@dataclass(eq=False)
class DieExpert:
    """One routed expert of a :class:`StreamDieJob`: its tokens (ascending batch positions),
    the PE group it runs on and its :class:`StreamGroupJob` (OUTPUT raw)."""

    expert: int
    rows: np.ndarray
    group: int
    job: StreamGroupJob


@dataclass
class DieResult:
    """Result of :meth:`StreamDieJob.run`.

    Attributes
    ----------
    y : float32 ``[T, H]``
        The layer's output: the experts' Q.24 partials summed (ascending expert id, saturating)
        and converted to FP32 once, as :func:`~elmoe3d.sw.golden.expert.ref_moe`.
    out : int64 ``[T, H]``
    acc_overflow, vpu_saturation : bool
        OR of every PE's sticky flags and of the host sum's saturation.
    link_words : int
        Words the groups' links moved.
    """

    y: np.ndarray
    out: np.ndarray
    acc_overflow: bool
    vpu_saturation: bool
    link_words: int


@dataclass(eq=False)
class StreamDieJob:
    """An MoE layer of real-shape experts on a die (:func:`compile_moe_die`)."""

    tokens: int
    hidden: int
    mode: Mode
    groups: int
    pes_per_group: int
    experts: list = field(default_factory=list)

    def group_experts(self, g: int) -> list:
        """The experts group ``g`` runs, in order."""
        return [d for d in self.experts if d.group == g]

    def run(self) -> DieResult:
        """Every expert's group job on the functional simulator (:func:`run_group`); the host
        sums the roots' Q.24 partials."""
        from .parallel import run_group
        out = np.zeros((self.tokens, self.hidden), np.int64)
        ovf = satd = False
        moved = 0
        for d in sorted(self.experts, key=lambda d: d.expert):
            res = run_group(d.job)
            part = d.job.decode_q24(res.o[d.job.root])
            out[d.rows], flag = saturating_add(out[d.rows], part)
            ovf |= res.acc_overflow
            satd |= res.vpu_saturation or bool(flag.any())
            moved += res.link_words
        return DieResult(y=q24_to_fp32(out), out=out, acc_overflow=ovf, vpu_saturation=satd,
                         link_words=moved)


def compile_moe_die(x, experts, routing, mode=Mode.FULL, config=None, *,
                    pes_per_group: int | None = None, lsb_src=Source.HB) -> StreamDieJob:
    """An MoE layer of real-shape experts on the die of ``config`` (ArchConfig): data
    parallelism over experts, every routed expert on one PE group (the group with the least
    assigned work, largest experts first: work = token tiles), tensor parallelism within the
    group (:func:`compile_expert_group`, OUTPUT raw); the host sums the Q.24 partials in
    ascending expert id (``StreamDieJob.run``), equal bit for bit to
    :func:`~elmoe3d.sw.golden.expert.ref_moe`.

    ``lsb_src``: where FULL reads the LSB planes (:func:`compile_expert_group`).

    Raises ProgramError (an expert slice that does not fit, named) or ValueError (routing)."""
    if not isinstance(config, ArchConfig):
        raise TypeError(f"config: expected an ArchConfig, got {type(config).__name__}")
    mode = _mode(mode)
    G = config.pes_per_group if pes_per_group is None else pes_per_group
    n_groups = config.pes // G
    exs = as_experts(experts)
    x = np.asarray(x)
    T = check_x(x, exs[0])
    ids, bits = parse_routing(routing, T, len(exs))
    routed = []
    for e in range(len(exs)):
        rows, gw = expert_tokens(ids, bits, e)
        if len(rows):
            routed.append((e, rows, gw))
    R = config.pe.rows
    load = [0] * n_groups
    place = {}
    for e, rows, _ in sorted(routed, key=lambda r: (-len(r[1]), r[0])):
        g = min(range(n_groups), key=lambda i: (load[i], i))
        place[e] = g
        load[g] += -(-len(rows) // R)
    job = StreamDieJob(tokens=T, hidden=exs[0].hidden, mode=mode, groups=n_groups,
                       pes_per_group=G)
    for e, rows, gw in routed:
        gj = compile_expert_group(x[rows], exs[e], gw.view(np.float16).astype(np.float32),
                                  mode, config, pes=G, raw_output=True, name=f"expert {e}",
                                  lsb_src=lsb_src)
        job.experts.append(DieExpert(expert=e, rows=rows, group=place[e], job=gj))
    return job
