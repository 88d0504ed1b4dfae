"""The PE's result stage: GEMM sink descriptors, the tile result register with ``psum_in``, the
RAW sink and the row feed of the VPU sinks (paper Sections 4.1 and 5.2, Fig. 10b;
``docs/pe.md``, "GEMM address generation")."""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ...config import RAW_SINK_LATENCY, TileConfig
from ...isa import Op, Sink
from ..checked import check_param
from ..fixed import sat_add64
from ..isa import op_layout, tok_entry_layout
from ..layouts import TileMode, tile_result_layout
from .common import SEQ, check_choice, check_word_bits, log2


__all__ = ["row_layout", "ResultStage"]


def row_layout(lanes: int) -> data.StructLayout:
    """A result row on its way into a VPU sink: ``acc`` (``lanes`` s64 accumulators), ``sink``
    (:class:`~elmoe3d.isa.Sink`), ``full`` (FULL mode), ``t`` (token row), ``ch`` (first
    channel of the block), ``stride`` (OUT / HBUF words per token row), ``keep`` (the GEMM's
    ``max_keep``: SWIGLU's channel 0 raises the row max instead of starting it)."""
    return data.StructLayout({"acc": data.ArrayLayout(signed(64), lanes), "sink": unsigned(2),
                              "full": unsigned(1), "t": unsigned(16), "ch": unsigned(16),
                              "stride": unsigned(16), "keep": unsigned(1)})


class ResultStage(wiring.Component):
    """A GEMM hands its sink parameters over when it starts issuing (``start``; not a GEMM
    with ``acc_hold``, which emits no result: the GEMM that ends a K chain brings the
    descriptor of the chain's result); the stage holds one pending (``dq``) and one active
    (``ds``) descriptor, so back-to-back GEMMs overlap their drain. Each tile result (``rows x
    lanes`` s64 accumulators) is held in the result register until its sink has taken it;
    one taken from the tile while the register is still busy waits in the skid register (the
    tile's ``o.ready`` is its empty flag, a register: no sink ``stall`` reaches the tile, issue
    25), which hands it on in the cycle the register frees:

    * ``psum_in``: the ``rows * lanes / (W/64)`` words of ``psum`` (one a cycle) are added into
      it with saturating s64 additions (``acc_set`` on saturation); word ``k`` holds
      accumulators ``[r][n]`` at value positions ``k W/64 ..`` (the RAW layout), i.e. rows
      ``2k`` and ``2k + 1``, which the sinks take once added;
    * RAW: ``rows * lanes / (W/64)`` words on ``raw`` (accumulator ``[r][n]`` at value
      ``r * lanes + n``), one a cycle with a ready link;
    * SWIGLU and COMBINE: one row a cycle into stage A (``row``), held there while the sink
      stalls it (``stall``). The TOK entry of a row is read the cycle before the row is taken
      into stage A (``row_t``: the row the result register offers next, or the first row of
      the tile result taken in this cycle) and enters stage A with it (``tok_entry``, a
      register), so that a sink's ``stall`` comes from registers: the TOK read data reaches
      no ready (issue 25: the tile's ``advance`` is ``result.ready``).

    Ports
    -----
    start_cur, args, seq : In
        A GEMM starts: its descriptor (``op_layout(Op.GEMM)``) and number.
    start_next, next_args, next_seq : In
        The same for a GEMM starting back to back (the next command's).
    result : In, stream of :func:`~elmoe3d.hw.layouts.tile_result_layout`
        The tile's results.
    psum_valid, psum_data : In ; psum_need : Out(1)
        ``link_i`` words for ``psum_in`` (taken while ``psum_need``).
    raw_ready : In(1) ; raw_valid, raw_data : Out
        The RAW sink's link words.
    stall : In(1)
        The VPU sink holds the row in stage A.
    row_valid, row, row_seq : Out
        Stage A (:func:`row_layout`) and its command's number.
    feed, feed_tok : Out
        The row offered to stage A in this cycle (:func:`row_layout`; taken unless ``stall``)
        and its TOK entry (from ``tok_data``), for a sink that registers values derived from
        them beside stage A.
    row_t : Out(16)
        The token row whose TOK entry is read in this cycle (the row offered to stage A in the
        next cycle).
    tok_data : In ; tok_entry : Out, :func:`~elmoe3d.hw.isa.tok_entry_layout`
        The TOK read port's data (a read every cycle, at ``row_t``, one cycle of latency);
        stage A's TOK entry (a register).
    skid_valid : Out(1)
        The skid register holds a tile result (taken while the result register was busy).
    acc_set : Out(1)
        An accumulator saturated: a tile result taken in this cycle, or a ``psum_in`` word
        added in the cycle before (registered; the GEMM is still pending then).
    dq_valid : Out(1)
        The pending descriptor slot is taken.
    busy : Out(1)
        A descriptor, a held result or a row in stage A.
    busy_behind : Out(1)
        A descriptor or a held result (work that still comes to stage A).
    pending, pending_seq : Out
        Valid bits and numbers of every place a GEMM's work can be here (descriptors, the
        skid and result registers, stage A, then ``tail`` cycles of a delay line covering the VPU
        pipelines after stage A), for completion tracking.

    Parameters
    ----------
    tile : TileConfig
    word_bits : int
        W.
    tail : int
        Cycles from a row leaving stage A to its sink's last write.
    io_parts : int
        Parts of a TOK word (``narrow_iomem``: P, else 1).

    Raises
    ------
    TypeError
        ``tile`` is not a :class:`~elmoe3d.config.TileConfig`.
    ValueError
        A parameter out of range (the message names it).
    """

    def __init__(self, *, tile: TileConfig, word_bits, tail, io_parts=1):
        if not isinstance(tile, TileConfig):
            raise TypeError(f"tile: expected a TileConfig, got {tile!r}")
        check_word_bits(word_bits)
        check_param("tail", tail)
        check_choice("io_parts", io_parts, (1, 2, 4))
        self._tile, self._word_bits, self._tail = tile, word_bits, tail
        self._io_parts = io_parts
        self._row_layout = row_layout(tile.lanes)
        n = 5 + tail
        super().__init__({
            "start_cur": In(1),
            "args": In(op_layout(Op.GEMM)),
            "seq": In(SEQ),
            "start_next": In(1),
            "next_args": In(op_layout(Op.GEMM)),
            "next_seq": In(SEQ),
            "result": In(stream.Signature(tile_result_layout(tile))),
            "psum_valid": In(1),
            "psum_data": In(word_bits),
            "psum_need": Out(1),
            "raw_ready": In(1),
            "raw_valid": Out(1),
            "raw_data": Out(word_bits),
            "stall": In(1),
            "row_valid": Out(1),
            "row": Out(self._row_layout),
            "row_seq": Out(SEQ),
            "feed": Out(self._row_layout),
            "feed_tok": Out(tok_entry_layout()),
            "row_t": Out(16),
            "tok_data": In(word_bits // io_parts),
            "tok_entry": Out(tok_entry_layout()),
            "acc_set": Out(1),
            "skid_valid": Out(1),
            "dq_valid": Out(1),
            "busy": Out(1),
            "busy_behind": Out(1),
            "pending": Out(n),
            "pending_seq": Out(SEQ).array(n),
        })

    @property
    def latency(self) -> int:
        """RAW sink: cycles from the tile result taken to its first link word offered, no
        stall: :data:`elmoe3d.config.RAW_SINK_LATENCY` (the PE's ``sink_latency[Sink.RAW]``)."""
        return RAW_SINK_LATENCY

    @property
    def raw_words(self) -> int:
        """Link words of a result: ``rows * lanes / (W/64)``."""
        return self._tile.rows * self._tile.lanes // (self._word_bits // 64)

    def elaborate(self, platform):
        m = Module()
        R, L, W = self._tile.rows, self._tile.lanes, self._word_bits
        OV = W // 64
        tile_o = self.result
        tile_out = tile_o.valid & tile_o.ready

        def desc_regs(prefix):
            return {
                "sink": Signal(2, name=f"{prefix}_sink"),
                "full": Signal(name=f"{prefix}_full"),
                "rbn": Signal(8, name=f"{prefix}_rbn"),
                "cbn": Signal(10, name=f"{prefix}_cbn"),
                "out_base": Signal(16, name=f"{prefix}_out_base"),
                "tok_base": Signal(8, name=f"{prefix}_tok_base"),
                "stride": Signal(16, name=f"{prefix}_stride"),
                "pin": Signal(name=f"{prefix}_pin"),
                "keep": Signal(name=f"{prefix}_keep"),
                "seq": Signal(SEQ, name=f"{prefix}_seq"),
            }
        dq, ds = desc_regs("dq"), desc_regs("ds")
        dq_valid = self.dq_valid
        s_active = Signal()
        s_cb = Signal(10)
        s_half = Signal()
        s_rb = Signal(8)
        s_t0 = Signal(16)            # tok_base + rb * rows
        s_ch = Signal(16)            # out_base + block index * channels per block
        s_last = (s_rb == ds["rbn"] - 1) & (~ds["full"] | s_half) & (s_cb == ds["cbn"] - 1)
        block_channels = Mux(ds["sink"] == Sink.SWIGLU,
                             Mux(ds["full"], L // 4, L // 2),
                             Mux(ds["full"], L // 2, L))

        res_valid = Signal()
        res_acc = Signal(data.ArrayLayout(data.ArrayLayout(signed(64), L), R))
        res_sink = Signal(2)
        res_full = Signal()
        res_t0 = Signal(16)
        res_ch = Signal(16)
        res_stride = Signal(16)
        res_pin = Signal()           # the held result takes psum_in words
        res_keep = Signal()          # max_keep (SWIGLU)
        res_seq = Signal(SEQ)
        res_done = Signal()          # the sink finishes the held result in this cycle
        # The skid register: a tile result taken while the result register is still busy
        # waits here, so the tile's ``o.ready`` is a register (issue 25: no sink ``stall``
        # reaches the tile's ``advance``, its input ``ready`` and the PE's issue logic)
        sk_valid = self.skid_valid
        tile_in = {
            "acc": tile_o.payload.acc, "sink": ds["sink"], "full": ds["full"], "t0": s_t0,
            "ch": s_ch, "stride": ds["stride"], "pin": ds["pin"], "keep": ds["keep"],
            "seq": ds["seq"],
        }
        sk = {k: Signal.like(res, name=f"sk_{k}") for k, res in (
            ("acc", res_acc), ("sink", res_sink), ("full", res_full), ("t0", res_t0),
            ("ch", res_ch), ("stride", res_stride), ("pin", res_pin), ("keep", res_keep),
            ("seq", res_seq))}
        res_regs = {"acc": res_acc, "sink": res_sink, "full": res_full, "t0": res_t0,
                    "ch": res_ch, "stride": res_stride, "pin": res_pin, "keep": res_keep,
                    "seq": res_seq}
        m.d.comb += tile_o.ready.eq(~sk_valid)
        res_free = ~res_valid | res_done          # the register takes a result in this cycle
        res_take = res_free & (sk_valid | tile_out)
        incoming = {k: Mux(sk_valid, sk[k], tile_in[k]) for k in sk}

        with m.If(res_done):
            m.d.sync += res_valid.eq(0)
        with m.If(res_take):
            m.d.sync += res_valid.eq(1)
            m.d.sync += [res_regs[k].eq(incoming[k]) for k in sk]
        with m.If(res_free):
            m.d.sync += sk_valid.eq(0)
        with m.Elif(tile_out):
            m.d.sync += sk_valid.eq(1)
            m.d.sync += [sk[k].eq(tile_in[k]) for k in sk]
        with m.If(tile_out):
            with m.If(s_rb == ds["rbn"] - 1):
                m.d.sync += [s_rb.eq(0), s_t0.eq(ds["tok_base"]),
                             s_ch.eq(s_ch + block_channels)]
                with m.If(~ds["full"] | s_half):
                    m.d.sync += [s_half.eq(0), s_cb.eq(s_cb + 1)]
                with m.Else():
                    m.d.sync += s_half.eq(1)
            with m.Else():
                m.d.sync += [s_rb.eq(s_rb + 1), s_t0.eq(s_t0 + R)]
            with m.If(s_last):
                m.d.sync += s_active.eq(0)
        with m.If(dq_valid & (~s_active | (tile_out & s_last))):
            m.d.sync += [dq_valid.eq(0), s_active.eq(1), s_cb.eq(0), s_half.eq(0),
                         s_rb.eq(0), s_t0.eq(dq["tok_base"]), s_ch.eq(dq["out_base"])]
            m.d.sync += [ds[k].eq(dq[k]) for k in dq]
        for start, f, seq in ((self.start_cur, self.args, self.seq),
                              (self.start_next, self.next_args, self.next_seq)):
            with m.If(start & ~f.acc_hold):         # acc_hold: no result, no descriptor
                m.d.sync += [
                    dq_valid.eq(1),
                    dq["sink"].eq(f.sink),
                    dq["full"].eq(f.mode == TileMode.FULL),
                    dq["rbn"].eq(f.row_blocks),
                    dq["cbn"].eq(f.col_blocks),
                    dq["out_base"].eq(f.out_base),
                    dq["tok_base"].eq(f.tok_base),
                    dq["stride"].eq(f.stride),
                    dq["pin"].eq(f.psum_in),
                    dq["keep"].eq(f.max_keep),
                    dq["seq"].eq(seq),
                ]

        # ---- psum_in: link words added into the held result, one word (W/64 values) a cycle
        raw_words = R * L // OV
        pin_k = Signal(range(raw_words + 1))      # words of the held result added so far
        pin_need = self.psum_need
        m.d.comb += pin_need.eq(res_valid & res_pin & (pin_k != raw_words))
        pin_take = self.psum_valid & pin_need
        res_bits = Value.cast(res_acc)
        pin_old = res_bits.word_select(pin_k[:max(log2(raw_words), 1)] if raw_words > 1 else 0,
                                       W)
        pin_sum = Signal(W)
        pin_ovf = Signal(OV)
        for j in range(OV):
            total, wrap = sat_add64(pin_old[64 * j:64 * (j + 1)],
                                    self.psum_data[64 * j:64 * (j + 1)])
            m.d.comb += [pin_sum[64 * j:64 * (j + 1)].eq(total), pin_ovf[j].eq(wrap)]
        with m.If(pin_take):
            m.d.sync += pin_k.eq(pin_k + 1)
            for k in range(raw_words):
                with m.If(pin_k == k):
                    m.d.sync += res_bits.word_select(k, W).eq(pin_sum)
        with m.If(res_take):
            m.d.sync += pin_k.eq(0)
        # a psum_in saturation sets the sticky flag a cycle later (issue 25: the 64-bit add
        # does not end in the flag's OR tree); the GEMM is still in flight then
        pin_sat = Signal()
        m.d.sync += pin_sat.eq(pin_take & pin_ovf.any())
        m.d.comb += self.acc_set.eq((tile_out & Value.cast(tile_o.payload.overflow).any())
                                    | pin_sat)

        # ---- RAW sink: accumulators onto the link, W/64 values per word
        raw_k = Signal(range(max(raw_words, 2)))
        raw_valid = self.raw_valid
        m.d.comb += [raw_valid.eq(res_valid & (res_sink == Sink.RAW)
                                  & (~res_pin | (raw_k < pin_k))),
                     self.raw_data.eq(res_bits.word_select(raw_k, W))]
        raw_take = raw_valid & self.raw_ready
        with m.If(raw_take):
            m.d.sync += raw_k.eq(Mux(raw_k == raw_words - 1, 0, raw_k + 1))
        raw_done = raw_take & (raw_k == raw_words - 1)

        # ---- VPU sinks' feed: one result row per cycle into stage A (held while stalled)
        res_r = Signal(range(max(R, 2)))
        vpu_rows = res_valid & (res_sink != Sink.RAW) & (~res_pin | ((res_r >> 1) < pin_k))
        stall_a = self.stall
        row_take = vpu_rows & ~stall_a
        with m.If(row_take):
            m.d.sync += res_r.eq(Mux(res_r == R - 1, 0, res_r + 1))
        vpu_res_done = row_take & (res_r == R - 1)
        a, a_valid, a_seq = self.row, self.row_valid, self.row_seq
        feed = self.feed
        m.d.comb += [
            feed.acc.eq(res_acc[res_r]),
            feed.sink.eq(res_sink),
            feed.full.eq(res_full),
            feed.t.eq(res_t0 + res_r),
            feed.ch.eq(res_ch),
            feed.stride.eq(res_stride),
            feed.keep.eq(res_keep),
        ]
        # TOK: the entry of the row offered next is read a cycle ahead (the first row of a
        # result taken now, else the row after the one taken now, else the same row again),
        # so stage A's entry is a register and no ready depends on the TOK read data
        log_tk = log2(OV) - log2(self._io_parts)   # TOK entries of a read: W/64/io_parts
        m.d.comb += self.row_t.eq(Mux(res_take, incoming["t0"], feed.t + row_take))
        tok_sel = Signal(max(log_tk, 1))            # the entry of the word read last cycle
        m.d.sync += tok_sel.eq(self.row_t[:log_tk] if log_tk else 0)
        m.d.comb += self.feed_tok.eq(self.tok_data.word_select(tok_sel[:log_tk] if log_tk
                                                               else 0, 64))
        with m.If(~stall_a):
            m.d.sync += [
                a_valid.eq(row_take),
                a.eq(feed),
                self.tok_entry.eq(self.feed_tok),
                a_seq.eq(res_seq),
            ]
        m.d.comb += res_done.eq(raw_done | vpu_res_done)
        m.d.comb += [self.busy_behind.eq(res_valid | sk_valid | dq_valid | s_active),
                     self.busy.eq(self.busy_behind | a_valid)]

        # completion of GEMMs: a descriptor (dq, ds), a held result, a row in stage A, then a
        # row in the SwiGLU or combine pipeline: a delay line as long as the longest of them
        # (no stall after stage A), whose last entry is the cycle the row's last write is made
        pending = [(dq_valid, dq["seq"]), (s_active, ds["seq"]), (sk_valid, sk["seq"]),
                   (res_valid, res_seq), (a_valid, a_seq)]
        feed = (a_valid & ~stall_a, a_seq)       # a row leaves stage A
        for k in range(self._tail):
            v, q = Signal(name=f"tail_v{k}"), Signal(SEQ, name=f"tail_seq{k}")
            m.d.sync += [v.eq(feed[0]), q.eq(feed[1])]
            pending.append(feed := (v, q))
        for k, (v, q) in enumerate(pending):
            m.d.comb += [self.pending[k].eq(v), self.pending_seq[k].eq(q)]
        return m
