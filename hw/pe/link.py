"""The PE's aggregation-link port: SEND (IOMEM words onto ``link_o``, beside the RAW sink's
words) and RECV (``link_i`` words into IOMEM, or accumulated: OUT saturating s64 addition,
ROWMAX unsigned max) (paper Sections 4.1 and 5.2, Fig. 6; ``docs/pe.md``, "Memories"
and "ROWMAX")."""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Module, Mux, Signal, unsigned
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ...isa import Op, Target
from ..fixed import sat_add64
from ..isa import op_layout
from .common import (act_part_elems, check_bool, check_choice, check_word_bits, log2, parts_of,
                     word_of)


__all__ = ["LINK_TARGETS", "LinkPort"]


#: The memories SEND reads and RECV writes, by target (port name prefixes).
LINK_TARGETS = {Target.ACT: "act", Target.TOK: "tok", Target.HBUF: "hbuf", Target.OUT: "out",
                Target.ROWMAX: "rowmax"}


class LinkPort(wiring.Component):
    """SEND: ``words`` words of a target memory onto ``link_o`` (a synchronous read a cycle,
    the word offered the cycle after; the RAW sink has ``link_o`` otherwise). RECV: ``words``
    ``link_i`` words into a target memory, one a cycle, or with ``accumulate`` (OUT, ROWMAX)
    read at accept, combined and written one cycle later (the read ports are transparent, so
    back-to-back words to one address see each other); ``link_i`` also carries a GEMM's
    ``psum_in`` words (never both: RECV waits for every GEMM). A memory stored in P parts
    (``narrow_iomem``, ``narrow_out``: the ``narrow`` targets) is read a part a cycle into a
    W-bit register, the word offered once complete (P + 1 cycles a word), and written a part
    a cycle (``link_i.ready`` with the last; accumulating a part a cycle).

    Ports
    -----
    link_o : Out, stream of W bits ; link_i : In, stream of W bits
    send_start, send_args, recv_start, recv_args : In
        SEND / RECV starts (``op_layout``), from the execute engine.
    sending, receiving : In(1)
        The execute engine is in SEND / RECV.
    send_done, recv_done : Out(1)
        The command finishes in this cycle.
    raw_valid, raw_data : In
        The RAW sink's word (``link_o`` outside SEND).
    psum_need : In(1)
        The result stage takes ``link_i`` words (``psum_in``).
    <t>_rd, <t>_rd_addr, <t>_rd_en : Out ; <t>_data : In
        Per target ``t`` (:data:`LINK_TARGETS`): SEND's read (the read port's condition,
        address and enable) and the port's data (also RECV's accumulate reads, of OUT and
        ROWMAX).
    <t>_w_en, <t>_w_addr, <t>_w_data : Out
        Per target: RECV's plain write (whole word or part).
    acc_out_rd, acc_out_addr, acc_rowmax_rd, acc_rowmax_addr : Out
        RECV ``accumulate``: the reads of OUT / ROWMAX.
    acc_out_w_en, acc_out_w_data, acc_rowmax_w_en, acc_rowmax_w_data, acc_w_addr : Out
        RECV ``accumulate``: the writes.
    vpu_set : Out(1)
        An OUT accumulation saturated (the sticky ``vpu_saturation``).

    Parameters
    ----------
    rows, group, word_bits : int
        R, G and W (ACT parts hold depths of every row).
    passes : int
        P, the parts of a word of a narrow target.
    narrow_iomem, narrow_out : bool
        ACT, TOK, HBUF and ROWMAX / OUT in P parts.

    Raises
    ------
    ValueError
        A parameter out of range (the message names it).
    """

    def __init__(self, *, rows, group, word_bits, passes=1, narrow_iomem=False,
                 narrow_out=False):
        check_word_bits(word_bits)
        check_choice("rows", rows, (word_bits // 256,))
        check_choice("passes", passes, (1, 2, 4))
        check_bool("narrow_iomem", narrow_iomem)
        check_bool("narrow_out", narrow_out)
        if (narrow_iomem or narrow_out) and passes == 1:
            raise ValueError("passes: a memory in parts needs 2 or 4, got 1")
        self._rows, self._group, self._word_bits, self._passes = rows, group, word_bits, passes
        self._narrow_iomem, self._narrow_out = narrow_iomem, narrow_out
        W, P = word_bits, passes
        narrow = self.narrow_targets
        log_np = log2(P) if narrow else 0
        members = {
            "link_o": Out(stream.Signature(unsigned(W))),
            "link_i": In(stream.Signature(unsigned(W))),
            "send_start": In(1),
            "send_args": In(op_layout(Op.SEND)),
            "recv_start": In(1),
            "recv_args": In(op_layout(Op.RECV)),
            "sending": In(1),
            "receiving": In(1),
            "send_done": Out(1),
            "recv_done": Out(1),
            "raw_valid": In(1),
            "raw_data": In(W),
            "psum_need": In(1),
        }
        for target, name in LINK_TARGETS.items():
            parts = P if target in narrow else 1
            members.update({
                f"{name}_rd": Out(1),
                f"{name}_rd_addr": Out(log_np + 16 if parts > 1 else 16),
                f"{name}_rd_en": Out(1),
                f"{name}_data": In(W // parts),
                f"{name}_w_en": Out(1),
                f"{name}_w_addr": Out(log_np + 16 if parts > 1 else 16),
                f"{name}_w_data": Out(W // parts),
            })
        o_parts = P if narrow_out else 1
        r_parts = P if narrow_iomem else 1
        members.update({
            "acc_out_rd": Out(1),
            "acc_out_addr": Out(log_np + 16 if narrow_out else 16),
            "acc_rowmax_rd": Out(1),
            "acc_rowmax_addr": Out(log_np + 16 if narrow_iomem else 16),
            "acc_w_addr": Out(16),
            "acc_out_w_en": Out(1),
            "acc_out_w_data": Out(W // o_parts),
            "acc_rowmax_w_en": Out(1),
            "acc_rowmax_w_data": Out(W // r_parts),
            "vpu_set": Out(1),
        })
        super().__init__(members)

    @property
    def narrow_targets(self) -> tuple:
        """The targets stored in P parts."""
        return (((Target.ACT, Target.TOK, Target.HBUF, Target.ROWMAX)
                 if self._narrow_iomem else ())
                + ((Target.OUT,) if self._narrow_out else ()))

    def elaborate(self, platform):
        m = Module()
        W, P = self._word_bits, self._passes
        OV, Q = W // 64, W // 32
        narrow, narrow_o = self._narrow_iomem, self._narrow_out
        narrow_targets = self.narrow_targets
        io_parts, out_parts = (P if narrow else 1), (P if narrow_o else 1)
        log_np = log2(P) if narrow_targets else 0
        act_elems = act_part_elems(self._rows, self._group, P)
        link_o, link_i = self.link_o, self.link_i
        sending, receiving = self.sending, self.receiving
        x_addr = Signal(16)
        x_left = Signal(17)
        x_target = Signal(3)

        def data_of(target):
            return getattr(self, f"{LINK_TARGETS[target]}_data")

        # ---- SEND: IOMEM words onto link_o
        with m.If(self.send_start):
            m.d.sync += [x_target.eq(self.send_args.target), x_addr.eq(self.send_args.addr),
                         x_left.eq(self.send_args.words)]
        sv = Signal()                 # read data of the target is valid in its read port
        send_adv = ~sv | link_o.ready

        def is_narrow(target_sig):
            return Cat(target_sig == t for t in narrow_targets).any()

        # a memory in parts (narrow_iomem, narrow_out): a word's P parts read one a cycle
        # (s_part), each put in its place in s_word the cycle after (s_cap), the word offered
        # once complete (s_full)
        s_narrow = is_narrow(x_target)
        s_part, s_cap_part = Signal(log_np), Signal(log_np)
        s_cap, s_full = Signal(), Signal()
        s_word = Signal(W)
        s_go = (sending & s_narrow & (x_left != 0) & (~s_full | link_o.ready)
                & ~(s_cap & (s_cap_part == P - 1)))
        for target, name in LINK_TARGETS.items():
            m.d.comb += getattr(self, f"{name}_rd").eq(sending & (x_target == target))
            if target in narrow_targets:
                m.d.comb += [getattr(self, f"{name}_rd_addr").eq(Cat(s_part, x_addr)),
                             getattr(self, f"{name}_rd_en").eq(s_go)]
            else:
                m.d.comb += [getattr(self, f"{name}_rd_addr").eq(x_addr),
                             getattr(self, f"{name}_rd_en").eq(send_adv & (x_left != 0))]
        send_data = Signal(W)
        with m.Switch(x_target):
            for target in LINK_TARGETS:
                with m.Case(target):
                    m.d.comb += send_data.eq(s_word if target in narrow_targets
                                             else data_of(target))
        with m.If(sending & send_adv & ~s_narrow):
            m.d.sync += sv.eq(x_left != 0)
            with m.If(x_left != 0):
                m.d.sync += [x_addr.eq(x_addr + 1), x_left.eq(x_left - 1)]
        m.d.comb += self.send_done.eq(sending & Mux(s_narrow,
                                                    (x_left == 0) & ~s_cap & ~s_full,
                                                    send_adv & (x_left == 0)))
        if narrow_targets:
            m.d.sync += [s_cap.eq(s_go), s_cap_part.eq(s_part)]
            with m.If(s_go):
                m.d.sync += s_part.eq(s_part + 1)
                with m.If(s_part == P - 1):
                    m.d.sync += [x_addr.eq(x_addr + 1), x_left.eq(x_left - 1)]
            for target in narrow_targets:
                places_of = word_of(target == Target.ACT, word_bits=W, act_elems=act_elems)
                for p, places in enumerate(places_of):
                    with m.If(s_cap & (x_target == target) & (s_cap_part == p)):
                        m.d.sync += [s_word[w0:w1].eq(data_of(target)[p0:p1])
                                     for (w0, w1), (p0, p1) in places]
            with m.If(s_cap & (s_cap_part == P - 1)):
                m.d.sync += s_full.eq(1)
            with m.Elif(link_o.ready):
                m.d.sync += s_full.eq(0)
        m.d.comb += [
            link_o.valid.eq(Mux(sending, Mux(s_narrow, s_full, sv), self.raw_valid)),
            link_o.payload.eq(Mux(sending, send_data, self.raw_data)),
        ]

        # ---- RECV: link_i words into IOMEM (accumulate: saturating add into OUT)
        with m.If(self.recv_start):
            m.d.sync += [x_target.eq(self.recv_args.target), x_addr.eq(self.recv_args.addr),
                         x_left.eq(self.recv_args.words)]
        recv_acc = self.recv_args.accumulate
        # link_i: RECV, or a GEMM's psum_in words (never both: RECV waits for every GEMM)
        # (a memory in parts: a word in P cycles, a part a cycle, taken with its last)
        r_part = Signal(log_np)
        r_narrow = is_narrow(x_target)
        recv_part = receiving & (x_left != 0) & r_narrow & link_i.valid
        m.d.comb += link_i.ready.eq(
            (receiving & (x_left != 0) & (~r_narrow | (r_part == P - 1))) | self.psum_need)
        recv_take = link_i.valid & link_i.ready & receiving
        with m.If(recv_take):
            m.d.sync += [x_addr.eq(x_addr + 1), x_left.eq(x_left - 1)]
        if narrow_targets:
            with m.If(recv_part):
                m.d.sync += r_part.eq(r_part + 1)
        for target, name in LINK_TARGETS.items():
            en = getattr(self, f"{name}_w_en")
            addr = getattr(self, f"{name}_w_addr")
            wdata = getattr(self, f"{name}_w_data")
            if target in narrow_targets:
                plain = recv_part & (x_target == target)
                if target in (Target.OUT, Target.ROWMAX):
                    plain = plain & ~recv_acc
                pieces = parts_of(link_i.payload, target == Target.ACT, word_bits=W,
                                  act_elems=act_elems)
                m.d.comb += [en.eq(plain), addr.eq(Cat(r_part, x_addr)),
                             wdata.eq(Array(pieces)[r_part])]
                continue
            plain = recv_take & (x_target == target)
            if target in (Target.OUT, Target.ROWMAX):
                plain = plain & ~recv_acc
            m.d.comb += [en.eq(plain), addr.eq(x_addr), wdata.eq(link_i.payload)]
        # accumulate: read at accept, combine and write one cycle later: OUT saturating s64
        # addition, ROWMAX unsigned 32-bit max (narrow_out / narrow_iomem: OUT / ROWMAX a part
        # a cycle, r_pdata the part of link_i)
        r_valid = Signal()
        r_addr = self.acc_w_addr
        r_is_out = x_target == Target.OUT
        m.d.comb += [
            self.acc_out_rd.eq(receiving & r_is_out),
            self.acc_out_addr.eq(Cat(r_part, x_addr) if narrow_o else x_addr),
            self.acc_rowmax_rd.eq(receiving & ~r_is_out),
            self.acc_rowmax_addr.eq(Cat(r_part, x_addr) if narrow else x_addr),
        ]
        m.d.sync += [r_valid.eq(Mux(r_narrow, recv_part, recv_take) & recv_acc),
                     r_addr.eq(Mux(r_narrow, Cat(r_part, x_addr), x_addr))]
        if narrow_targets:
            r_pdata = Signal(W // P)
            m.d.sync += r_pdata.eq(link_i.payload.word_select(r_part, W // P))
        if not (narrow and narrow_o):
            r_data = Signal(W)
            m.d.sync += r_data.eq(link_i.payload)
        r_out_data = r_pdata if narrow_o else r_data
        r_rmax_data = r_pdata if narrow else r_data
        out_data, rmax_data = data_of(Target.OUT), data_of(Target.ROWMAX)
        ov_acc = OV // out_parts                  # values of an OUT read
        acc_sum = self.acc_out_w_data
        acc_ovf = Signal(ov_acc)
        for j in range(ov_acc):
            total, wrap = sat_add64(out_data[64 * j:64 * (j + 1)],
                                    r_out_data[64 * j:64 * (j + 1)])
            m.d.comb += [acc_sum[64 * j:64 * (j + 1)].eq(total), acc_ovf[j].eq(wrap)]
        m.d.comb += [self.acc_out_w_en.eq(r_valid & r_is_out),
                     self.vpu_set.eq(r_valid & r_is_out & acc_ovf.any())]
        max_word = self.acc_rowmax_w_data
        for j in range(Q // io_parts):
            old, new = rmax_data[32 * j:32 * (j + 1)], r_rmax_data[32 * j:32 * (j + 1)]
            m.d.comb += max_word[32 * j:32 * (j + 1)].eq(Mux(new > old, new, old))
        m.d.comb += [self.acc_rowmax_w_en.eq(r_valid & ~r_is_out),
                     self.recv_done.eq(receiving & (x_left == 0) & ~r_valid)]
        return m
