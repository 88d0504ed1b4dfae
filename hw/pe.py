"""The processing element (PE): memories, command decoder, load and execute engines, the
tensor tile and its sinks (paper Sections 4.1 and 5.2, Fig. 6 centre, Fig. 10b).

The contract is ``docs/pe.md``; the ISA is :mod:`elmoe3d.isa`; the numerics are
``docs/numerics.md``. The functional reference is :mod:`elmoe3d.sw.fsim`: the RTL and it run
the same programs in the same tests and are compared with plain equality.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..config import ArchConfig, PEConfig, TileConfig
from ..isa import OP_BITS, OPS, Op, Sink, Target
from .layouts import TileMode
from .tile import TensorTile


__all__ = ["PE"]


_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


def _field_positions():
    """``{op: {field: (lsb, width)}}`` from the one ISA table (:data:`elmoe3d.isa.OPS`)."""
    out = {}
    for op, fields in OPS.items():
        pos, table = OP_BITS, {}
        for f in fields:
            table[f.name] = (pos, f.width)
            pos += f.width
        out[op] = table
    return out


_FIELDS = _field_positions()


def _sat_add64(a, b):
    """Saturating signed 64-bit addition: ``(sum, overflowed)`` expressions."""
    total = a.as_signed() + b.as_signed()          # signed(65), exact
    wrap = total[64] != total[63]
    value = Mux(wrap, Mux(total[64], Const(_INT64_MIN, signed(64)),
                          Const(_INT64_MAX, signed(64))), total[:64].as_signed())
    return value, wrap


class _Writes:
    """Prioritised write requests onto one memory write port; the load engine is served last
    and is told through :attr:`busy` when an engine with priority writes in this cycle."""

    def __init__(self, port, *, name):
        self.port = port
        self.name = name
        self.requests = []
        self.busy = Signal(name=f"{name}_wbusy")

    def request(self, en, addr, data, mask=None):
        self.requests.append((en, addr, data, mask))

    def build(self, m, low=None):
        port = self.port
        full_mask = (1 << len(port.en)) - 1
        reqs = list(self.requests)
        m.d.comb += self.busy.eq(Cat(r[0] for r in reqs).any() if reqs else 0)
        if low is not None:
            reqs.append(low)
        first = True
        for en, addr, data, mask in reqs:
            ctx = m.If(en) if first else m.Elif(en)
            first = False
            with ctx:
                m.d.comb += [
                    port.addr.eq(addr),
                    port.data.eq(data),
                    port.en.eq(full_mask if mask is None else mask),
                ]


class _Reads:
    """Prioritised users of one synchronous read port (``en`` low holds the data)."""

    def __init__(self, port):
        self.port = port
        self.requests = []

    def request(self, cond, addr, en=1):
        self.requests.append((cond, addr, en))

    def build(self, m):
        m.d.comb += self.port.en.eq(0)
        first = True
        for cond, addr, en in self.requests:
            ctx = m.If(cond) if first else m.Elif(cond)
            first = False
            with ctx:
                m.d.comb += [self.port.addr.eq(addr), self.port.en.eq(en)]


class PE(wiring.Component):
    """One ELMoE-3D processing element running fused SwiGLU experts from a command stream.

    Placeholder; the full docstring is written with the sinks.
    """

    def __init__(self, *, config):
        if isinstance(config, ArchConfig):
            pe_config = config.pe
        elif isinstance(config, PEConfig):
            pe_config = config
        else:
            raise TypeError(f"config: expected an ArchConfig or a PEConfig, got "
                            f"{type(config).__name__}")
        if pe_config.lanes % 4 or pe_config.lanes != 2 * pe_config.rows:
            raise ValueError(f"config: the PE needs lanes % 4 == 0 and lanes == 2 * rows, got "
                             f"rows={pe_config.rows}, lanes={pe_config.lanes}")
        self._pe = pe_config
        self._tile_config = TileConfig(rows=pe_config.rows, lanes=pe_config.lanes)
        W = pe_config.word_bits
        super().__init__({
            "cmd": In(stream.Signature(unsigned(128))),   # TODO hw.isa.command_layout
            "ld": In(stream.Signature(unsigned(W))),
            "o": Out(stream.Signature(data.StructLayout({"kind": 1, "data": W}))),
            "link_o": Out(stream.Signature(unsigned(W))),
            "link_i": In(stream.Signature(unsigned(W))),
        })

    # ---- parameters ---------------------------------------------------------------------------

    @property
    def config(self) -> PEConfig:
        """Memory geometry (:class:`~elmoe3d.config.PEConfig`)."""
        return self._pe

    @property
    def rows(self) -> int:
        return self._pe.rows

    @property
    def lanes(self) -> int:
        return self._pe.lanes

    @property
    def word_bits(self) -> int:
        """W: bits of every memory word and of every ``ld``, ``o`` and link beat."""
        return self._pe.word_bits

    @property
    def tile_latency(self) -> int:
        """Cycles from the tile accepting a ``last`` beat to its result (TensorTile.latency)."""
        return TensorTile(config=self._tile_config).latency


    def elaborate(self, platform):
        m = Module()
        cfg = self._pe
        R, L, W = cfg.rows, cfg.lanes, cfg.word_bits
        OV = W // 64                  # Q.24 values per OUT word, TOK entries per word
        Q = W // 32                   # Q16.16 values per HBUF word

        def fld(src, op, name):
            pos, width = _FIELDS[op][name]
            return src[pos:pos + width]

        # ---- memories (one write port, one synchronous read port each) ------------------------
        def memory(name, depth, *, width=W, granularity=None, transparent=False):
            mem = Memory(shape=unsigned(width), depth=depth, init=[])
            m.submodules[name] = mem
            wp = mem.write_port(granularity=granularity)
            rp = mem.read_port(transparent_for=(wp,) if transparent else ())
            return _Reads(rp), _Writes(wp, name=name)

        wmsb = [memory(f"wmsb{b}", cfg.wmem_words) for b in range(2)]
        wlsb = [memory(f"wlsb{b}", cfg.wmem_words) for b in range(2)]
        wscl = [memory(f"wscale{b}", cfg.wscale_words) for b in range(2)]
        act_rp, act_w = memory("act", cfg.act_words, granularity=8)
        tok_rp, tok_w = memory("tok", cfg.tok_words, granularity=8)
        hbuf_rp, hbuf_w = memory("hbuf", cfg.hbuf_words, granularity=32)
        out_rp, out_w = memory("out", cfg.out_words, granularity=64, transparent=True)
        rmax_rp, rmax_w = memory("rowmax", cfg.tok_entries, width=32, transparent=True)
        # target -> (buffer -> writes) for the load engine
        load_targets = {
            Target.WMSB: [wmsb[0][1], wmsb[1][1]],
            Target.WLSB: [wlsb[0][1], wlsb[1][1]],
            Target.WSCALE: [wscl[0][1], wscl[1][1]],
            Target.ACT: [act_w],
            Target.TOK: [tok_w],
            Target.HBUF: [hbuf_w],
            Target.OUT: [out_w],
        }

        # ---- sticky flags and performance counters ----------------------------------------------
        flag_acc = Signal()       # a tile accumulator saturated
        flag_vpu = Signal()       # a VPU saturation (SwiGLU, requant clip, combine)

        # ---- command decoder ----------------------------------------------------------------------
        raw = Value.cast(self.cmd.payload)
        op = raw[:OP_BITS]
        is_load = op == Op.LOAD
        ld_active = Signal()
        ex_idle = Signal()
        ex_barrier = Signal()
        m.d.comb += self.cmd.ready.eq(Mux(is_load, ~ld_active & ~ex_barrier, ex_idle))
        take = self.cmd.valid & self.cmd.ready

        # ---- load engine ------------------------------------------------------------------------
        full = [Signal(name="full0"), Signal(name="full1")]
        full_sel = lambda b: Mux(b, full[1], full[0])          # noqa: E731
        ld_target = Signal(3)
        ld_buf = Signal()
        ld_addr = Signal(16)
        ld_left = Signal(16)
        ld_signal = Signal()
        with m.If(take & is_load):
            m.d.sync += [
                ld_active.eq(1),
                ld_target.eq(fld(raw, Op.LOAD, "target")),
                ld_buf.eq(fld(raw, Op.LOAD, "buf")),
                ld_addr.eq(fld(raw, Op.LOAD, "addr")),
                ld_left.eq(fld(raw, Op.LOAD, "words")),
                ld_signal.eq(fld(raw, Op.LOAD, "signal")),
            ]
        ld_blocked = (ld_target <= Target.WSCALE) & full_sel(ld_buf)
        ld_grant = Signal()
        m.d.comb += self.ld.ready.eq(ld_active & (ld_left != 0) & ~ld_blocked & ld_grant)
        ld_xfer = self.ld.valid & self.ld.ready
        with m.If(ld_xfer):
            m.d.sync += [ld_addr.eq(ld_addr + 1), ld_left.eq(ld_left - 1)]
        ld_finish = ld_active & (ld_left == 0) & ~ld_blocked
        with m.If(ld_finish):
            m.d.sync += ld_active.eq(0)
            with m.If(ld_signal):
                with m.If(ld_buf):
                    m.d.sync += full[1].eq(1)
                with m.Else():
                    m.d.sync += full[0].eq(1)

        # ---- execute engine: GEMM address generator -------------------------------------------
        xc = Signal(len(raw))                    # the command being executed
        xop = xc[:OP_BITS]
        gx = lambda name: fld(xc, Op.GEMM, name)    # noqa: E731
        g_is_full = gx("mode") == TileMode.FULL.value
        g_cb = Signal(10)
        g_half = Signal()
        g_rb = Signal(8)
        g_g = Signal(8)
        g_act_row = Signal(16)                   # act_base + rb * groups
        g_w_blk = Signal(16)                     # w_base + cb * groups
        g_issuing = Signal()
        g_last_g = g_g == gx("groups") - 1
        g_last_rb = g_rb == gx("row_blocks") - 1
        g_last_half = ~g_is_full | g_half
        g_last_cb = g_cb == gx("col_blocks") - 1
        g_final = g_last_g & g_last_rb & g_last_half & g_last_cb

        # beat stage: the read ports' data plus the beat's side band
        bv = Signal()
        b_mode = Signal(2)
        b_wbuf = Signal()
        b_half = Signal()
        b_slot = Signal(3)
        b_first = Signal()
        b_last = Signal()
        tile = m.submodules.tile = TensorTile(config=self._tile_config)
        adv = ~bv | tile.i.ready
        g_step = g_issuing & adv
        w_addr = g_w_blk + g_g
        for b in range(2):
            wmsb[b][0].request(1, w_addr, adv)
            wlsb[b][0].request(1, w_addr, adv)
            wscl[b][0].request(1, w_addr >> 3, adv)
        with m.If(adv):
            m.d.sync += [
                bv.eq(g_issuing),
                b_mode.eq(gx("mode")),
                b_wbuf.eq(gx("wbuf")),
                b_half.eq(g_half),
                b_slot.eq(w_addr[:3]),
                b_first.eq(g_g == 0),
                b_last.eq(g_last_g),
            ]
        with m.If(g_step):
            with m.If(g_last_g):
                m.d.sync += g_g.eq(0)
                with m.If(g_last_rb):
                    m.d.sync += [g_rb.eq(0), g_act_row.eq(gx("act_base"))]
                    with m.If(g_last_half):
                        m.d.sync += [g_half.eq(0), g_cb.eq(g_cb + 1),
                                     g_w_blk.eq(g_w_blk + gx("groups"))]
                    with m.Else():
                        m.d.sync += g_half.eq(1)
                with m.Else():
                    m.d.sync += [g_rb.eq(g_rb + 1), g_act_row.eq(g_act_row + gx("groups"))]
            with m.Else():
                m.d.sync += g_g.eq(g_g + 1)

        # the tile beat (docs/pe.md "GEMM address generation")
        beat = tile.i.payload
        msb_word = Mux(b_wbuf, wmsb[1][0].port.data, wmsb[0][0].port.data)
        lsb_word = Mux(b_wbuf, wlsb[1][0].port.data, wlsb[0][0].port.data)
        scl_word = Mux(b_wbuf, wscl[1][0].port.data, wscl[0][0].port.data)
        scl_entry = scl_word.word_select(b_slot, 16 * L)
        b_is_full = b_mode == TileMode.FULL.value
        b_is_lsb = b_mode == TileMode.LSB_ONLY.value
        lane = lambda word, n: word[128 * n:128 * (n + 1)]      # noqa: E731
        lane_scale = lambda n: scl_entry[16 * n:16 * (n + 1)]   # noqa: E731
        for n in range(L):
            i = n // 2
            src_full = Mux(b_half, i + L // 2, i)
            full_wgt = (msb_word if n % 2 == 0 else lsb_word).word_select(src_full, 128)
            m.d.comb += [
                Value.cast(beat.wgt[n]).eq(Mux(b_is_full, full_wgt,
                                               Mux(b_is_lsb, lane(lsb_word, n),
                                                   lane(msb_word, n)))),
                beat.scale[n].eq(Mux(b_is_full, scl_entry.word_select(src_full, 16),
                                     lane_scale(n))),
            ]
        m.d.comb += [
            Value.cast(beat.act).eq(act_rp.port.data),
            beat.mode.eq(b_mode),
            beat.first.eq(b_first),
            beat.last.eq(b_last),
            tile.i.valid.eq(bv),
        ]
        tile_pending = Signal(range(2 + 4 * 8))      # last beats accepted, results not taken
        tile_in_last = tile.i.valid & tile.i.ready & beat.last
        tile_out = tile.o.valid & tile.o.ready
        m.d.sync += tile_pending.eq(tile_pending + tile_in_last - tile_out)

        # ---- sink: GEMM descriptors, result capture --------------------------------------------
        # A GEMM hands its sink parameters to the sink when it starts issuing; the sink holds one
        # pending and one active descriptor, so back-to-back GEMMs overlap their drain.
        def desc_regs(prefix):
            return {
                "sink": Signal(2, name=f"{prefix}_sink"),
                "full": Signal(name=f"{prefix}_full"),
                "rbn": Signal(8, name=f"{prefix}_rbn"),
                "cbn": Signal(10, name=f"{prefix}_cbn"),
                "out_base": Signal(16, name=f"{prefix}_out_base"),
                "tok_base": Signal(8, name=f"{prefix}_tok_base"),
                "stride": Signal(16, name=f"{prefix}_stride"),
            }
        dq, ds = desc_regs("dq"), desc_regs("ds")
        dq_valid = Signal()
        s_active = Signal()
        s_cb = Signal(10)
        s_half = Signal()
        s_rb = Signal(8)
        s_t0 = Signal(16)            # tok_base + rb * rows
        s_ch = Signal(16)            # out_base + block * channels per block
        s_last = ((s_rb == ds["rbn"] - 1) & (~ds["full"] | s_half) & (s_cb == ds["cbn"] - 1))

        # channels a block contributes: SWIGLU P = lanes/2 (lanes/4 FULL), COMBINE lanes (/2)
        def block_channels(d):
            swiglu = Mux(d["full"], L // 4, L // 2)
            combine = Mux(d["full"], L // 2, L)
            return Mux(d["sink"] == Sink.SWIGLU, swiglu, combine)

        res_valid = Signal()
        res_acc = Signal(data.ArrayLayout(data.ArrayLayout(signed(64), L), R))
        res_sink = Signal(2)
        res_full = Signal()
        res_t0 = Signal(16)
        res_ch = Signal(16)
        res_stride = Signal(16)
        res_done = Signal()          # the sink finishes the held result in this cycle
        m.d.comb += tile.o.ready.eq(~res_valid | res_done)

        with m.If(res_done):
            m.d.sync += res_valid.eq(0)
        with m.If(tile_out):
            overflow = Value.cast(tile.o.payload.overflow)
            m.d.sync += [
                res_valid.eq(1),
                res_acc.eq(tile.o.payload.acc),
                res_sink.eq(ds["sink"]),
                res_full.eq(ds["full"]),
                res_t0.eq(s_t0),
                res_ch.eq(s_ch),
                res_stride.eq(ds["stride"]),
                flag_acc.eq(flag_acc | overflow.any()),
            ]
            with m.If(s_rb == ds["rbn"] - 1):
                m.d.sync += [s_rb.eq(0), s_t0.eq(ds["tok_base"]),
                             s_ch.eq(s_ch + block_channels(ds))]
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

        # ---- RAW sink: accumulators onto link_o, W/64 values per word ----------------------------
        raw_words = R * L // OV
        raw_k = Signal(range(max(raw_words, 2)))
        res_bits = Value.cast(res_acc)
        raw_valid = res_valid & (res_sink == Sink.RAW)
        raw_take = raw_valid & self.link_o.ready
        with m.If(raw_take):
            m.d.sync += raw_k.eq(Mux(raw_k == raw_words - 1, 0, raw_k + 1))
        raw_done = raw_take & (raw_k == raw_words - 1)

        # ---- execute engine: control ---------------------------------------------------------------
        vpu_busy = Signal()           # the VPU sink pipelines hold rows
        vpu_res_done = Signal()
        m.d.comb += res_done.eq(raw_done | vpu_res_done)
        gemm_busy = (g_issuing | bv | (tile_pending != 0) | res_valid | dq_valid | s_active
                     | vpu_busy)

        # SEND / RECV / CLEAR / REQUANT / OUTPUT share an address and a count
        x_addr = Signal(16)
        x_left = Signal(17)
        x_target = Signal(3)
        st = {name: Signal(name=f"st_{name.lower()}") for name in
              ("CLEAR", "STATUS", "SEND", "RECV", "REQUANT", "OUTPUT")}

        def release_buffer():
            with m.If(gx("release")):
                with m.If(gx("wbuf")):
                    m.d.sync += full[1].eq(0)
                with m.Else():
                    m.d.sync += full[0].eq(0)

        x_done = Signal()             # the current multi-cycle op finishes in this cycle

        with m.FSM(name="ex"):
            with m.State("IDLE"):
                m.d.comb += ex_idle.eq(1)
                with m.If(take & ~is_load):
                    m.d.sync += xc.eq(raw)
                    m.next = "DISPATCH"
            with m.State("DISPATCH"):
                m.d.comb += ex_barrier.eq(xop == Op.BARRIER)
                with m.Switch(xop):
                    with m.Case(Op.GEMM):
                        m.next = "GEMM_START"
                    with m.Case(Op.BARRIER, Op.CLEAR, Op.STATUS, Op.SEND, Op.RECV, Op.REQUANT,
                                Op.OUTPUT):
                        m.next = "DRAIN"
                    with m.Default():
                        m.next = "IDLE"
            with m.State("GEMM_START"):
                empty = (gx("row_blocks") == 0) | (gx("col_blocks") == 0) | (gx("groups") == 0)
                ready = ~gx("wait") | full_sel(gx("wbuf"))
                with m.If(ready & empty):
                    release_buffer()
                    m.next = "IDLE"
                with m.Elif(ready & ~dq_valid):
                    m.d.sync += [
                        g_cb.eq(0), g_half.eq(0), g_rb.eq(0), g_g.eq(0),
                        g_act_row.eq(gx("act_base")), g_w_blk.eq(gx("w_base")),
                        dq_valid.eq(1),
                        dq["sink"].eq(gx("sink")),
                        dq["full"].eq(g_is_full),
                        dq["rbn"].eq(gx("row_blocks")),
                        dq["cbn"].eq(gx("col_blocks")),
                        dq["out_base"].eq(gx("out_base")),
                        dq["tok_base"].eq(gx("tok_base")),
                        dq["stride"].eq(gx("stride")),
                    ]
                    m.next = "GEMM_RUN"
            with m.State("GEMM_RUN"):
                m.d.comb += g_issuing.eq(1)
                with m.If(g_step & g_final):
                    release_buffer()
                    m.next = "IDLE"
            with m.State("DRAIN"):
                m.d.comb += ex_barrier.eq(xop == Op.BARRIER)
                with m.If(~gemm_busy):
                    with m.Switch(xop):
                        with m.Case(Op.BARRIER):
                            m.next = "BARRIER"
                        with m.Case(Op.CLEAR):
                            m.d.sync += [x_addr.eq(0),
                                         x_left.eq(max(cfg.out_words, cfg.tok_entries))]
                            with m.If(fld(xc, Op.CLEAR, "flags")):
                                m.d.sync += [flag_acc.eq(0), flag_vpu.eq(0)]
                            m.next = "CLEAR"
                        with m.Case(Op.STATUS):
                            m.next = "STATUS"
                        with m.Case(Op.SEND):
                            m.d.sync += [x_target.eq(fld(xc, Op.SEND, "target")),
                                         x_addr.eq(fld(xc, Op.SEND, "addr")),
                                         x_left.eq(fld(xc, Op.SEND, "words"))]
                            m.next = "SEND"
                        with m.Case(Op.RECV):
                            m.d.sync += [x_target.eq(fld(xc, Op.RECV, "target")),
                                         x_addr.eq(fld(xc, Op.RECV, "addr")),
                                         x_left.eq(fld(xc, Op.RECV, "words"))]
                            m.next = "RECV"
                        with m.Case(Op.REQUANT):
                            m.next = "REQUANT"
                        with m.Case(Op.OUTPUT):
                            m.next = "OUTPUT"
            with m.State("BARRIER"):
                m.d.comb += ex_barrier.eq(1)
                with m.If(~ld_active):
                    m.next = "IDLE"
            for name in st:
                with m.State(name):
                    m.d.comb += st[name].eq(1)
                    with m.If(x_done):
                        m.next = "IDLE"

        # ---- CLEAR ------------------------------------------------------------------------------
        with m.If(st["CLEAR"]):
            m.d.sync += [x_addr.eq(x_addr + 1), x_left.eq(x_left - 1)]
            out_w.request(fld(xc, Op.CLEAR, "out") & (x_addr < cfg.out_words), x_addr, 0)
            rmax_w.request(fld(xc, Op.CLEAR, "rowmax") & (x_addr < cfg.tok_entries), x_addr, 0)
        clear_done = st["CLEAR"] & (x_left <= 1)

        # ---- SEND: target memory words onto link_o ------------------------------------------------
        sv = Signal()                 # read data of the target is valid in its read port
        send_adv = ~sv | self.link_o.ready
        send_reads = {Target.ACT: act_rp, Target.TOK: tok_rp, Target.HBUF: hbuf_rp,
                      Target.OUT: out_rp}
        for target, rp in send_reads.items():
            rp.request(st["SEND"] & (x_target == target), x_addr, send_adv)
        send_data = Signal(W)
        with m.Switch(x_target):
            for target, rp in send_reads.items():
                with m.Case(target):
                    m.d.comb += send_data.eq(rp.port.data)
        with m.If(st["SEND"] & send_adv):
            m.d.sync += sv.eq(x_left != 0)
            with m.If(x_left != 0):
                m.d.sync += [x_addr.eq(x_addr + 1), x_left.eq(x_left - 1)]
        send_done = st["SEND"] & send_adv & (x_left == 0)

        # ---- link_o: RAW results or SEND words ----------------------------------------------------
        m.d.comb += [
            self.link_o.valid.eq(Mux(st["SEND"], sv, raw_valid)),
            self.link_o.payload.eq(Mux(st["SEND"], send_data,
                                       res_bits.word_select(raw_k, W))),
        ]

        # ---- RECV: link_i words into a memory (accumulate: saturating add) -------------------------
        r_valid = Signal()
        r_addr = Signal(16)
        r_data = Signal(W)
        recv_acc = fld(xc, Op.RECV, "accumulate")
        m.d.comb += self.link_i.ready.eq(st["RECV"] & (x_left != 0))
        recv_take = self.link_i.valid & self.link_i.ready
        with m.If(recv_take):
            m.d.sync += [x_addr.eq(x_addr + 1), x_left.eq(x_left - 1)]
        recv_writes = {Target.ACT: act_w, Target.TOK: tok_w, Target.HBUF: hbuf_w,
                       Target.OUT: out_w}
        for target, wr in recv_writes.items():
            plain = recv_take & (x_target == target)
            if target == Target.OUT:
                plain = plain & ~recv_acc
            wr.request(plain, x_addr, self.link_i.payload)
        # accumulate into OUT: read at accept, add and write one cycle later (the read port is
        # transparent, so back-to-back words to one address see each other)
        out_rp.request(st["RECV"], x_addr, 1)
        m.d.sync += [r_valid.eq(recv_take & recv_acc & (x_target == Target.OUT)),
                     r_addr.eq(x_addr), r_data.eq(self.link_i.payload)]
        acc_sum = Signal(W)
        acc_ovf = Signal(OV)
        for j in range(OV):
            total, wrap = _sat_add64(out_rp.port.data[64 * j:64 * (j + 1)],
                                     r_data[64 * j:64 * (j + 1)])
            m.d.comb += [acc_sum[64 * j:64 * (j + 1)].eq(total), acc_ovf[j].eq(wrap)]
        out_w.request(r_valid, r_addr, acc_sum)
        with m.If(r_valid):
            m.d.sync += flag_vpu.eq(flag_vpu | acc_ovf.any())
        recv_done = st["RECV"] & (x_left == 0) & ~r_valid

        # ---- STATUS -----------------------------------------------------------------------------
        status_done = st["STATUS"] & self.o.ready

        m.d.comb += x_done.eq(clear_done | send_done | recv_done | status_done | st["REQUANT"] | st["OUTPUT"])
        # ---- o port ---------------------------------------------------------------------------
        m.d.comb += [
            self.o.valid.eq(st["STATUS"]),
        ]

        # ---- the ACT read port: the GEMM's unless SEND holds it ----------------------------------
        act_rp.request(~st["SEND"], g_act_row + g_g, adv)

        # ---- build the port muxes; the load engine writes with the lowest priority ---------------
        grants = []
        for target, writes in load_targets.items():
            for b, wr in enumerate(writes):
                sel = ld_target == target
                if len(writes) == 2:
                    sel = sel & (ld_buf == b)
                wr.build(m, low=(ld_xfer & sel, ld_addr, self.ld.payload, None))
                grants.append((sel, ~wr.busy))
        grant = Const(1)
        for sel, ok in grants:
            grant = Mux(sel, ok, grant)
        m.d.comb += ld_grant.eq(grant)
        rmax_w.build(m)
        for reads in (*(w[0] for w in wmsb + wlsb + wscl), act_rp, tok_rp, hbuf_rp, out_rp,
                      rmax_rp):
            reads.build(m)
        return m
