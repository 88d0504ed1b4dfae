"""VPU datapath units: SwiGLU, row-max exponent, INT8 requantization, expert combination and the
Q.24 -> FP32 conversion (paper Section 4.1 "VPU"; ``docs/numerics.md`` §7-8).

Every unit is **per element**: one value per cycle (initiation interval 1); the PE instantiates
as many lanes as it needs. Each has an input stream ``i`` and an output stream ``o``
(:mod:`amaranth.lib.stream`) whose payloads are the ``data.StructLayout`` s returned by the
``*_layout`` functions below, and a ``tag`` field of ``tag_width`` bits that travels with the
element unchanged (write address, row end, ...; zero bits by default).

The golden model is :mod:`elmoe3d.sw.golden.vpu`; the units equal it bit for bit:

======================= ==================================================== ===========================
unit                    function                                             latency (cycles)
======================= ==================================================== ===========================
:class:`SwiGLUUnit`     :func:`~elmoe3d.sw.golden.vpu.swiglu_q16`            ``swiglu_latency(mul_stages)``
:class:`RowMaxExponent` :func:`~elmoe3d.sw.golden.vpu.requant_exponent`      ``ROWMAX_LATENCY``
:class:`RequantUnit`    :func:`~elmoe3d.sw.golden.vpu.requant_shift`         ``REQUANT_LATENCY``
:class:`CombineUnit`    :func:`~elmoe3d.sw.golden.vpu.combine_term` + sat.   ``combine_latency(mul_stages)``
:class:`Fp32Converter`  :func:`~elmoe3d.sw.golden.vpu.q24_to_fp32`           ``FP32_LATENCY``
======================= ==================================================== ===========================

The latencies are defined once, in :mod:`elmoe3d.config`; each unit's ``latency`` property
reads them.

Flow control (all units): the pipeline advances unless a result is offered and not taken;
``i.ready = ~o.valid | o.ready`` (combinational in ``o.ready``, never in ``i.valid``);
``o.valid`` and the output payload are registers. No element is lost or duplicated; with an
always-ready sink a result appears exactly ``latency`` cycles after its input was accepted.
A unit built with ``always_ready=True`` has constant-1 ``ready`` signals and no enables (its
sink never holds a result back).
"""

from __future__ import annotations

from amaranth.hdl import C, Cat, Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import data, stream
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..checks import check_int
from ..config import (FP32_LATENCY, REQUANT_LATENCY, ROWMAX_LATENCY, check_mul_stages,
                      combine_latency, swiglu_latency)
from ..sw.golden import vpu as golden
from .checked import CheckedComponent
from .fixed import (mul_parts, mul_sum, rne_sat_finish, rne_shift, rshift_rne_parts,
                    rshift_rne_sat, sat_add64)


__all__ = [
    "SwiGLUUnit", "RowMaxExponent", "RequantUnit", "CombineUnit", "Fp32Converter",
    "swiglu_in_layout", "swiglu_out_layout", "rowmax_in_layout", "rowmax_out_layout",
    "requant_in_layout", "requant_out_layout", "combine_in_layout", "combine_out_layout",
    "fp32_in_layout", "fp32_out_layout", "SIGMOID_ROM_LAYOUT", "sigmoid_rom_init",
]


# ---- payload layouts ------------------------------------------------------------------------------

def swiglu_in_layout(tag_width: int = 0) -> data.StructLayout:
    """:class:`SwiGLUUnit` input: ``acc_up``, ``acc_gate`` (signed(64), Q.24 accumulators of the
    up and gate GEMMs), ``e_x`` (signed(8), the token's activation exponent), ``tag``."""
    return data.StructLayout({"acc_up": signed(64), "acc_gate": signed(64), "e_x": signed(8),
                              "tag": unsigned(tag_width)})


def swiglu_out_layout(tag_width: int = 0) -> data.StructLayout:
    """:class:`SwiGLUUnit` output: ``h`` (signed(32), Q16.16), ``sat`` (1: u, g or h
    saturated), ``tag``."""
    return data.StructLayout({"h": signed(32), "sat": unsigned(1), "tag": unsigned(tag_width)})


def rowmax_in_layout(tag_width: int = 0) -> data.StructLayout:
    """:class:`RowMaxExponent` input: ``max`` (unsigned(32), a row's max |h| in Q16.16 units,
    at most 2^31 for int32 rows), ``tag``."""
    return data.StructLayout({"max": unsigned(32), "tag": unsigned(tag_width)})


def rowmax_out_layout(tag_width: int = 0) -> data.StructLayout:
    """:class:`RowMaxExponent` output: ``e`` (signed(8), e' in [-6, 26]; 0 for a zero max),
    ``e_h`` (signed(8), ``e' - 16``, the down-projection exponent), ``tag``."""
    return data.StructLayout({"e": signed(8), "e_h": signed(8), "tag": unsigned(tag_width)})


def requant_in_layout(tag_width: int = 0) -> data.StructLayout:
    """:class:`RequantUnit` input: ``h`` (signed(32), Q16.16), ``e`` (signed(8), the row's
    e'), ``tag``."""
    return data.StructLayout({"h": signed(32), "e": signed(8), "tag": unsigned(tag_width)})


def requant_out_layout(tag_width: int = 0) -> data.StructLayout:
    """:class:`RequantUnit` output: ``h_q`` (signed(8), -127..127), ``clip`` (1: the clip to
    +-127 changed the value; never with e' from the row max), ``tag``."""
    return data.StructLayout({"h_q": signed(8), "clip": unsigned(1), "tag": unsigned(tag_width)})


def combine_in_layout(tag_width: int = 0) -> data.StructLayout:
    """:class:`CombineUnit` input: ``acc_y`` (signed(64), Q.24 down-GEMM accumulator),
    ``e_h`` (signed(8), the token's down-projection exponent), ``gw`` (unsigned(16), the
    router's FP16 gate weight, raw bits), ``out`` (signed(64), the Q.24 running sum read from
    OUT), ``flag`` (1, its sticky saturation flag), ``tag``."""
    return data.StructLayout({"acc_y": signed(64), "e_h": signed(8), "gw": unsigned(16),
                              "out": signed(64), "flag": unsigned(1),
                              "tag": unsigned(tag_width)})


def combine_out_layout(tag_width: int = 0) -> data.StructLayout:
    """:class:`CombineUnit` output: ``out`` (signed(64), the new Q.24 sum), ``flag`` (1,
    sticky), ``tag``."""
    return data.StructLayout({"out": signed(64), "flag": unsigned(1), "tag": unsigned(tag_width)})


def fp32_in_layout(tag_width: int = 0) -> data.StructLayout:
    """:class:`Fp32Converter` input: ``value`` (signed(64), Q.24), ``tag``."""
    return data.StructLayout({"value": signed(64), "tag": unsigned(tag_width)})


def fp32_out_layout(tag_width: int = 0) -> data.StructLayout:
    """:class:`Fp32Converter` output: ``bits`` (unsigned(32), IEEE 754 binary32), ``tag``."""
    return data.StructLayout({"bits": unsigned(32), "tag": unsigned(tag_width)})


#: One sigmoid ROM word: ``base = T[i]`` (0..65536, 17 bits) and ``diff = T[i+1] - T[i]``
#: (0..1024, 11 bits), so the interpolation needs one read port.
SIGMOID_ROM_LAYOUT = data.StructLayout({"base": unsigned(17), "diff": unsigned(11)})


def sigmoid_rom_init() -> list[dict]:
    """The 512 words of the sigmoid ROM, from :func:`elmoe3d.sw.golden.vpu.sigmoid_table`."""
    t = [int(x) for x in golden.sigmoid_table()]
    return [{"base": t[i], "diff": t[i + 1] - t[i]} for i in range(len(t) - 1)]


def _check_tag_width(tag_width):
    return check_int("tag_width", tag_width, 0, 64, numpy=False)


#: Slices of the narrower operand of a VPU multiplier: its partial products are registered
#: and added in the next cycle, so neither cycle holds a whole 32 x 32 (SwiGLU) or 64 x 12
#: (combine) multiply (docs/synth.md, "Timing").
MUL_CHUNKS = 2


def _prefix_or(m, v, width, *, name):
    """``p[i] = v[0] | v[1] | ... | v[i]`` for the ``width`` low bits of ``v`` (Kogge-Stone:
    log2(width) levels of 2-input ORs), a Signal in ``m``'s ``comb`` domain.

    Every level is a Signal and one vector OR with a constant shift: as nested per-bit
    expressions each bit would repeat its whole cone (and each leaf ``v[j]`` its own copy of
    ``v``'s operator), 2,080 leaves for 64 bits instead of 6 x 64 gates, which made Amaranth's
    netlist checks and Verilator's compile of the die minutes longer."""
    level = Signal(width, name=f"{name}_l0")
    m.d.comb += level.eq(v)
    step, n = 1, 1
    while step < width:
        nxt = Signal(width, name=f"{name}_l{n}")
        m.d.comb += nxt.eq(level | (level << step)[:width])     # bit i |= bit i - step
        level, step, n = nxt, step * 2, n + 1
    p = Signal(width, name=name)
    m.d.comb += p.eq(level)
    return p


def _lzc_tree(v):
    """Leading zeros of ``v`` (a power-of-two width ``2^k``) as a tree: ``(zero, count)``, the
    count (k bits) valid when ``zero`` is low. Halves combine as ``count = Cat(zero_hi ?
    count_lo : count_hi, zero_hi)``: k levels of multiplexers instead of a 2^k-deep chain."""
    v = Value.cast(v)
    if len(v) == 1:
        return ~v[0], C(0, 0)
    half = len(v) // 2
    z_lo, c_lo = _lzc_tree(v[:half])
    z_hi, c_hi = _lzc_tree(v[half:])
    return z_lo & z_hi, Cat(Mux(z_hi, c_lo, c_hi), z_hi)


class _Pipeline:
    """Stage registers that load when the pipeline advances (``advance``: no result is held
    back by the sink). ``stage(**values)`` registers every value and returns the registers."""

    def __init__(self, m: Module, advance):
        self.m = m
        self.advance = advance
        self.n = 0

    def stage(self, **values):
        self.n += 1
        regs = {}
        for key, val in values.items():
            if isinstance(val, data.View):
                reg = Signal(val.shape(), name=f"s{self.n}_{key}")
            else:
                reg = Signal(Value.cast(val).shape(), name=f"s{self.n}_{key}")
            with self.m.If(self.advance):
                self.m.d.sync += reg.eq(val)
            regs[key] = reg
        return regs


class _Unit(CheckedComponent):
    """Common frame: ``i``/``o`` streams, the global advance and the output register. The
    parameters (``mul_stages`` where a unit has it, ``tag_width``) are checked before the
    unit exists."""

    @classmethod
    def check(cls, *, tag_width, always_ready, **params):
        if "mul_stages" in params:
            check_mul_stages(params["mul_stages"])
        _check_tag_width(tag_width)
        if not isinstance(always_ready, bool):
            raise TypeError(f"always_ready: expected a bool, got {always_ready!r}")

    def __init__(self, in_layout, out_layout, tag_width, always_ready):
        self._tag_width = tag_width
        self._always_ready = always_ready
        super().__init__({
            "i": In(stream.Signature(in_layout, always_ready=always_ready)),
            "o": Out(stream.Signature(out_layout, always_ready=always_ready)),
        })

    @property
    def always_ready(self) -> bool:
        """``True``: the sink takes every result as it appears (``o.ready`` and ``i.ready`` are
        the constant 1 of ``stream.Signature(always_ready=True)``), so the stage registers load
        every cycle and carry no enable logic. The PE's SWIGLU and COMBINE sinks and its
        row-max exponent never hold a result back; a standalone unit synthesised for the area
        roll-up must then be this one, not one with enables its PE never uses."""
        return self._always_ready

    @property
    def tag_width(self) -> int:
        """Bits of the ``tag`` field carried from ``i`` to ``o`` unchanged."""
        return self._tag_width

    def _frame(self):
        m = Module()
        if self._always_ready:                 # i.ready and o.ready are constant 1
            return m, _Pipeline(m, C(1, 1))
        advance = Signal()
        m.d.comb += [
            advance.eq(~self.o.valid | self.o.ready),
            self.i.ready.eq(advance),
        ]
        return m, _Pipeline(m, advance)

    def _input(self, pipe):
        """The input register: ``i.valid`` and ``i.payload`` registered before the unit's first
        stage, so that stage starts from a flop and not from the sink's row and channel select
        in front of it (docs/synth.md "Timing", the cross-leaf paths into the SwiGLU and
        combine units). One cycle of :attr:`latency`. Returns ``(valid, payload)``."""
        s = pipe.stage(valid=self.i.valid, payload=self.i.payload)
        return s["valid"], s["payload"]

    def _output(self, m, pipe, valid, **fields):
        """The final stage register is the output: ``o.valid`` and ``o.payload``."""
        with m.If(pipe.advance):
            m.d.sync += self.o.valid.eq(valid)
            for key, val in fields.items():
                m.d.sync += getattr(self.o.payload, key).eq(val)
        pipe.n += 1
        return pipe.n


# ---- SwiGLU --------------------------------------------------------------------------------------

class SwiGLUUnit(_Unit):
    """One SwiGLU element per cycle: ``h = silu(g) * u`` in Q16.16 (numerics 7.1-7.3; paper 4.1
    "VPU ... SiLU"). Golden: :func:`elmoe3d.sw.golden.vpu.swiglu_q16`.

    ``u = sat32(rshift_rne(acc_up, 8 - e_x))`` and ``g`` likewise (one rounding barrel shifter
    each); SiLU by linear interpolation in the 513-entry sigmoid table, held as a 512 x 28-bit
    ROM (``amaranth.lib.memory.Memory``, one synchronous read port, words
    :data:`SIGMOID_ROM_LAYOUT`); ``h = sat32(rshift_rne(silu * u, 16))``. ``sat`` is the OR of
    the three saturations.

    Pipeline (``mul_stages = 1``; every stage within 1 ns at 0.7 V on ASAP7, ``docs/synth.md``
    "Timing")::

        t   : the input register                            -> i.payload
        t+1 : to_q16 shifts of acc_up, acc_gate, round bits -> pre, inc
        t+2 : rounding increment, saturation               -> u, g, sat
        t+3 : ROM address (g + 16) >> 1/16                  -> ROM word
        t+4 : sig = T[i] + rne(diff * frac, 12)             -> sig
        t+5 : g * sig, MUL_CHUNKS partial products          -> parts
        t+6 : their sum                                     -> product (+ mul_stages - 1 registers)
        t+7 : silu = rne(product, 16), or g, or 0           -> silu
        t+8 : silu * u, MUL_CHUNKS partial products         -> parts
        t+9 : their sum (64 bits)                           -> product (+ mul_stages - 1 registers)
        t+10: h = sat32(rne(product, 16))                   -> o.payload
        t+11: o.valid

    Parameters
    ----------
    tag_width : int, 0..64
        Bits of the pass-through ``tag``.
    mul_stages : int, 1..4
        Registers after the sum of each multiplier's partial products (more than 1 lets
        synthesis retime them).

    Attributes
    ----------
    i : In(stream.Signature(swiglu_in_layout(tag_width)))
    o : Out(stream.Signature(swiglu_out_layout(tag_width)))

    Raises
    ------
    ValueError
        A parameter out of range.
    """

    def __init__(self, *, tag_width: int = 0, mul_stages: int = 1,
                 always_ready: bool = False):
        self._mul_stages = mul_stages
        super().__init__(swiglu_in_layout(tag_width), swiglu_out_layout(tag_width),
                         tag_width, always_ready)

    @property
    def mul_stages(self) -> int:
        return self._mul_stages

    @property
    def latency(self) -> int:
        """Cycles from accepting an element to ``o.valid`` with an always-ready sink
        (:func:`elmoe3d.config.swiglu_latency`)."""
        return swiglu_latency(self._mul_stages)

    def elaborate(self, platform):
        m, pipe = self._frame()
        valid, p = self._input(pipe)
        shift = Signal(signed(9))
        m.d.comb += shift.eq(8 - p.e_x)
        u_pre, u_inc = rshift_rne_parts(m, p.acc_up, shift, out_bits=32, name="u")
        g_pre, g_inc = rshift_rne_parts(m, p.acc_gate, shift, out_bits=32, name="g")
        s0 = pipe.stage(valid=valid, tag=p.tag, u_pre=u_pre, u_inc=u_inc, g_pre=g_pre,
                        g_inc=g_inc)
        u, su = rne_sat_finish(m, s0["u_pre"], s0["u_inc"], out_bits=32, name="u")
        g, sg = rne_sat_finish(m, s0["g_pre"], s0["g_inc"], out_bits=32, name="g")
        s1 = pipe.stage(valid=s0["valid"], tag=s0["tag"], u=u, g=g, sat=su | sg)

        # Table index: x = g + 16 (Q16.16), i = x >> 12, frac = x & 4095, for -16 <= g < 16.
        lim = golden.SILU_LIMIT
        x = Signal(signed(34))
        inside = Signal()
        m.d.comb += [
            x.eq(s1["g"] + lim),
            inside.eq((s1["g"] >= -lim) & (s1["g"] < lim)),
        ]
        rom = Memory(shape=SIGMOID_ROM_LAYOUT, depth=golden.SIG_ENTRIES - 1,
                     init=sigmoid_rom_init())
        m.submodules.sigmoid_rom = rom
        rd = rom.read_port(domain="sync")
        m.d.comb += [
            rd.en.eq(pipe.advance),
            rd.addr.eq(Mux(inside, x[golden.SIG_STEP_BITS:golden.SIG_STEP_BITS + 9], 0)),
        ]
        s2 = pipe.stage(valid=s1["valid"], tag=s1["tag"], u=s1["u"], g=s1["g"],
                        sat=s1["sat"], frac=x[:golden.SIG_STEP_BITS],
                        hi=s1["g"] >= lim, lo=s1["g"] < -lim)

        interp = Signal(unsigned(23))
        sig = Signal(unsigned(18))
        m.d.comb += [
            interp.eq(rd.data.diff * s2["frac"]),
            sig.eq(rd.data.base + rne_shift(interp, golden.SIG_STEP_BITS)),
        ]
        s3 = pipe.stage(valid=s2["valid"], tag=s2["tag"], u=s2["u"], g=s2["g"], sat=s2["sat"],
                        hi=s2["hi"], lo=s2["lo"], sig=sig)

        # g * sig (32 x 17 bits): partial products, then their sum (+ mul_stages - 1)
        parts1 = mul_parts(s3["g"], s3["sig"], MUL_CHUNKS)
        sa = pipe.stage(valid=s3["valid"], tag=s3["tag"], u=s3["u"], g=s3["g"], sat=s3["sat"],
                        hi=s3["hi"], lo=s3["lo"], **{f"pp{i}": pp for i, (pp, _) in enumerate(parts1)})
        prod1 = Signal(signed(50))
        m.d.comb += prod1.eq(mul_sum([sa[f"pp{i}"] for i in range(len(parts1))],
                                     [sh for _, sh in parts1]))
        sk = dict(valid=sa["valid"], tag=sa["tag"], u=sa["u"], g=sa["g"], sat=sa["sat"],
                  hi=sa["hi"], lo=sa["lo"], prod=prod1)
        for _ in range(self._mul_stages):
            sk = pipe.stage(**sk)

        silu = Signal(signed(32))
        m.d.comb += silu.eq(Mux(sk["hi"], sk["g"],
                                Mux(sk["lo"], 0, rne_shift(sk["prod"], golden.SIG_FRAC_BITS))))
        s5 = pipe.stage(valid=sk["valid"], tag=sk["tag"], u=sk["u"], sat=sk["sat"], silu=silu)

        # silu * u (32 x 32 bits): partial products, then their sum (+ mul_stages - 1)
        parts2 = mul_parts(s5["silu"], s5["u"], MUL_CHUNKS)
        sb = pipe.stage(valid=s5["valid"], tag=s5["tag"], sat=s5["sat"],
                        **{f"pp{i}": pp for i, (pp, _) in enumerate(parts2)})
        prod2 = Signal(signed(64))
        m.d.comb += prod2.eq(mul_sum([sb[f"pp{i}"] for i in range(len(parts2))],
                                     [sh for _, sh in parts2]))   # |silu * u| < 2^62
        sk = dict(valid=sb["valid"], tag=sb["tag"], sat=sb["sat"], prod=prod2)
        for _ in range(self._mul_stages):
            sk = pipe.stage(**sk)

        h, sh = rshift_rne_sat(m, sk["prod"], C(golden.SIG_FRAC_BITS, signed(6)), out_bits=32,
                               name="h")
        n = self._output(m, pipe, sk["valid"], tag=sk["tag"], h=h, sat=sk["sat"] | sh)
        assert n == self.latency
        return m


# ---- requantization --------------------------------------------------------------------------------

class RowMaxExponent(_Unit):
    """``e'`` of a row from its max |h| (numerics 7.5): the smallest integer with
    ``max <= 127 * 2^e'``, 0 for a zero max; also ``e_h = e' - 16``. Golden:
    :func:`elmoe3d.sw.golden.vpu.requant_exponent`. One row max per cycle.

    A thermometer of 32 comparisons ``max > floor(127 * 2^e)`` for e = -6..25 (constants),
    counted: ``e' = -6 + count``. Exact for every 32-bit input (e' in [-6, 26]).

    Latency 1 (comparisons and count, then the output register).

    Parameters
    ----------
    tag_width : int, 0..64

    Attributes
    ----------
    i : In(stream.Signature(rowmax_in_layout(tag_width)))
    o : Out(stream.Signature(rowmax_out_layout(tag_width)))
    """

    E_MIN = -6
    E_MAX = 26

    def __init__(self, *, tag_width: int = 0, always_ready: bool = False):
        super().__init__(rowmax_in_layout(tag_width), rowmax_out_layout(tag_width),
                         tag_width, always_ready)

    @property
    def latency(self) -> int:
        return ROWMAX_LATENCY

    def elaborate(self, platform):
        m, pipe = self._frame()
        mx = self.i.payload.max
        above = [mx > ((127 << e) if e >= 0 else (127 >> -e))
                 for e in range(self.E_MIN, self.E_MAX)]
        count = Signal(range(len(above) + 1))
        total = above[0]
        for a in above[1:]:
            total = total + a
        m.d.comb += count.eq(total)
        e = Signal(signed(8))
        m.d.comb += e.eq(Mux(mx == 0, 0, count + self.E_MIN))
        self._output(m, pipe, self.i.valid, tag=self.i.payload.tag, e=e,
                     e_h=e - golden.Q16_FRAC_BITS)
        return m


class RequantUnit(_Unit):
    """One INT8 code per cycle: ``h_q = clip(rshift_rne(h, e'), -127, 127)`` (numerics 7.5).
    Golden: :func:`elmoe3d.sw.golden.vpu.requant_shift`.

    ``e'`` comes with every element (the row's e', from :class:`RowMaxExponent` after the max
    all-reduce). Right shifts up to 32 round half to even; ``e' < 0`` is an exact left shift.
    ``clip`` reports a clip that changed the value (never with e' from the row's max).

    Latency 1 (rounding barrel shifter and clip, then the output register).

    Parameters
    ----------
    tag_width : int, 0..64

    Attributes
    ----------
    i : In(stream.Signature(requant_in_layout(tag_width)))
    o : Out(stream.Signature(requant_out_layout(tag_width)))
    """

    def __init__(self, *, tag_width: int = 0, always_ready: bool = False):
        super().__init__(requant_in_layout(tag_width), requant_out_layout(tag_width),
                         tag_width, always_ready)

    @property
    def latency(self) -> int:
        return REQUANT_LATENCY

    def elaborate(self, platform):
        m, pipe = self._frame()
        p = self.i.payload
        val, sat = rshift_rne_sat(m, p.h, p.e, out_bits=8, name="hq")
        neg128 = val == -128
        self._output(m, pipe, self.i.valid, tag=p.tag, h_q=Mux(neg128, -127, val),
                     clip=sat | neg128)
        return m


# ---- expert combination -------------------------------------------------------------------------

class CombineUnit(_Unit):
    """One output element per cycle: the read-modify-write arithmetic of the expert combination
    (numerics 8; numerics §8). Golden: :func:`elmoe3d.sw.golden.vpu.combine_term` followed by a
    saturating add (:func:`elmoe3d.sw.golden.vpu.combine`).

    The FP16 gate weight decodes to ``m`` (signed 12 bits: ``1024 + f`` or ``f``, negated by
    the sign) and ``E`` (``e - 25``, or -24 for subnormals; e = 31 gives 6);
    ``term = sat64(rshift_rne(acc_y * m, -(e_h + E)))`` with the exact 76-bit product;
    ``out_new = sat64(out + term)``; ``flag_new = flag | term saturated | sum saturated``.

    The unit does not read or write the OUT memory: the PE reads ``out``/``flag`` into the
    input beat and writes ``o`` back (and must not issue a read of an address whose write is
    still in flight, ``latency`` cycles).

    Pipeline (``mul_stages = 1``; every stage within 1 ns at 0.7 V on ASAP7)::

        t   : the input register                                  -> i.payload
        t+1 : decode gw, acc_y * m in MUL_CHUNKS partial products -> parts
        t+2 : their sum (76 bits)                               -> product (+ mul_stages - 1)
        t+3 : shift by -(e_h + E), round bits                   -> pre, inc
        t+4 : rounding increment, sat64                         -> term, sat
        t+5 : out + term, saturated; sticky flag                -> o.payload
        t+6 : o.valid

    Parameters
    ----------
    tag_width : int, 0..64
    mul_stages : int, 1..4
        Registers after the multiplier.

    Attributes
    ----------
    i : In(stream.Signature(combine_in_layout(tag_width)))
    o : Out(stream.Signature(combine_out_layout(tag_width)))
    """

    def __init__(self, *, tag_width: int = 0, mul_stages: int = 1,
                 always_ready: bool = False):
        self._mul_stages = mul_stages
        super().__init__(combine_in_layout(tag_width), combine_out_layout(tag_width),
                         tag_width, always_ready)

    @property
    def mul_stages(self) -> int:
        return self._mul_stages

    @property
    def latency(self) -> int:
        """Cycles from accepting an element to ``o.valid`` with an always-ready sink
        (:func:`elmoe3d.config.combine_latency`)."""
        return combine_latency(self._mul_stages)

    def elaborate(self, platform):
        m, pipe = self._frame()
        valid, p = self._input(pipe)
        sign, exp, frac = p.gw[15], p.gw[10:15], p.gw[0:10]
        mag = Signal(unsigned(11))
        big_e = Signal(signed(6))
        shift = Signal(signed(9))                   # -(e_h + E) in [-133, 152]
        prod = Signal(signed(76))                   # |acc_y * m| < 2^74
        m.d.comb += [
            mag.eq(Cat(frac, exp != 0)),            # frac or 1024 + frac
            big_e.eq(Mux(exp == 0, -24, exp - 25)),
            shift.eq(-(p.e_h + big_e)),
        ]
        # acc_y * m with m = (-1)^sign mag: the partial products of acc_y * mag, each inverted
        # for a negative m (~x = -x - 1), and their sum plus sum(2^shift) for the inversions
        # (-sum(x 2^s) = sum(~x 2^s) + sum(2^s)): no negation in front of the multiplier
        parts = [(Mux(sign, ~pp, pp), sh) for pp, sh in mul_parts(p.acc_y, mag, MUL_CHUNKS)]
        fix = sum(1 << sh for _, sh in parts)
        sa = pipe.stage(valid=valid, tag=p.tag, out=p.out, flag=p.flag, shift=shift,
                        neg=sign, **{f"pp{i}": pp for i, (pp, _) in enumerate(parts)})
        m.d.comb += prod.eq(mul_sum([sa[f"pp{i}"] for i in range(len(parts))],
                                    [sh for _, sh in parts]) + Mux(sa["neg"], fix, 0))
        sk = dict(valid=sa["valid"], tag=sa["tag"], out=sa["out"], flag=sa["flag"],
                  shift=sa["shift"], prod=prod)
        for _ in range(self._mul_stages):
            sk = pipe.stage(**sk)

        pre, inc = rshift_rne_parts(m, sk["prod"], sk["shift"], out_bits=64, name="term")
        sr = pipe.stage(valid=sk["valid"], tag=sk["tag"], out=sk["out"], flag=sk["flag"],
                        pre=pre, inc=inc)
        term, st = rne_sat_finish(m, sr["pre"], sr["inc"], out_bits=64, name="term")
        s2 = pipe.stage(valid=sr["valid"], tag=sr["tag"], out=sr["out"], flag=sr["flag"],
                        term=term, sat=st)

        new, wrap = sat_add64(s2["out"], s2["term"])
        n = self._output(m, pipe, s2["valid"], tag=s2["tag"], out=new,
                         flag=s2["flag"] | s2["sat"] | wrap)
        assert n == self.latency
        return m


# ---- FP32 conversion ------------------------------------------------------------------------------

class Fp32Converter(_Unit):
    """One Q.24 value per cycle to IEEE binary32 bits, ``float32(value * 2^-24)``, round to
    nearest even straight from the integer (numerics 8). Golden:
    :func:`elmoe3d.sw.golden.vpu.q24_to_fp32`.

    Magnitude ``|v|`` (64 bits unsigned, so -2^63 is fine) with bit length ``b``; the top 24
    bits are rounded half to even on the bits below (round bit and sticky); a carry out bumps
    the exponent. The biased exponent is ``b + 102`` (+1 on a carry): every nonzero input is a
    normal number, none overflows; 0 gives +0.0.

    Pipeline (every stage within 1 ns at 0.7 V on ASAP7, with the PE's OUT read in front of the
    first: ``docs/synth.md`` "Timing")::

        t   : sign, magnitude (prefix OR, no carry chain), leading-zero count -> registers
        t+1 : normalise, round, pack                                          -> o.payload
        t+2 : o.valid

    Parameters
    ----------
    tag_width : int, 0..64

    Attributes
    ----------
    i : In(stream.Signature(fp32_in_layout(tag_width)))
    o : Out(stream.Signature(fp32_out_layout(tag_width)))
    """

    def __init__(self, *, tag_width: int = 0, always_ready: bool = False):
        super().__init__(fp32_in_layout(tag_width), fp32_out_layout(tag_width),
                         tag_width, always_ready)

    @property
    def latency(self) -> int:
        return FP32_LATENCY

    def elaborate(self, platform):
        m, pipe = self._frame()
        v = self.i.payload.value
        neg = v < 0
        # |v| without a carry chain: -v = ~v + 1 flips bit i of v exactly where a lower bit
        # is set, so |v| = v ^ (neg & prefix_or(v)) with prefix_or(v)[i] = OR of v[0 .. i-1]
        # (a log-depth prefix OR; -(-2^63) = 2^63 as 64 bits unsigned)
        below = _prefix_or(m, v.as_unsigned() << 1, 64, name="below")
        mag = Signal(unsigned(64))
        m.d.comb += mag.eq(v.as_unsigned() ^ (below & neg.replicate(64)))
        lzc = Signal(range(65))
        zero, count = _lzc_tree(mag)                    # log2(64) levels of muxes
        m.d.comb += lzc.eq(Mux(zero, 64, count))
        s1 = pipe.stage(valid=self.i.valid, tag=self.i.payload.tag, neg=neg, mag=mag, lzc=lzc)

        norm = Signal(unsigned(64))
        m.d.comb += norm.eq((s1["mag"] << s1["lzc"])[:64])   # top bit at 63 (if nonzero)
        mant = Signal(unsigned(25))                           # top 24 bits, rounded
        m.d.comb += mant.eq(rne_shift(norm, 40))
        carry = mant[24]
        # bit length b = 64 - lzc; biased exponent b - 25 + 127 = 166 - lzc (+ carry).
        exp = Signal(unsigned(8))
        frac = Signal(unsigned(23))
        m.d.comb += [
            exp.eq(166 - s1["lzc"] + carry),
            frac.eq(Mux(carry, 0, mant[:23])),
        ]
        bits = Signal(unsigned(32))
        m.d.comb += bits.eq(Mux(s1["mag"] == 0, 0,
                                frac | (exp << 23) | (s1["neg"].as_unsigned() << 31)))
        self._output(m, pipe, s1["valid"], tag=s1["tag"], bits=bits)
        return m
