"""Exhaustive Amaranth-simulator tests of the IA8xW5 unit PE and the slice combiner against the
golden model (:mod:`elmoe3d.sw.golden.datapath`, numerics §3).

* every activation (256) x every nibble (16) x {MSB aug 0, MSB aug 1, LSB}: the unit PE;
* every activation (256) x every INT8 weight (256) x every mode (4): two unit PEs (MSB and LSB
  slice, driven by :func:`elmoe3d.hw.unit_pe.lane_controls`) and a :class:`SliceCombiner`.

To keep the simulation short, a combinational wrapper holds one unit PE (or slice pair) per
activation value, so one simulator step checks 256 products.
"""

import time

import numpy as np
import pytest
from amaranth.hdl import C, Fragment, Module, Mux, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from elmoe3d.hw.layouts import TileMode
from elmoe3d.hw.unit_pe import PRODUCT_SHAPE, SliceCombiner, UnitPE, lane_controls
from elmoe3d.sw.golden.datapath import Mode, lsb_field, msb_field, slice_product, unit_pe
from elmoe3d.sw.golden.quant import lsb_slice, msb_slice


ACTS = np.arange(-128, 128)


class _PEArray(wiring.Component):
    """256 unit PEs, PE i hardwired to activation i - 128, sharing nibble/is_msb/aug."""

    def __init__(self):
        super().__init__({
            "nibble": In(unsigned(4)),
            "is_msb": In(1),
            "aug": In(1),
            "product": Out(data.ArrayLayout(PRODUCT_SHAPE, len(ACTS))),
        })

    def elaborate(self, platform):
        m = Module()
        for i, a in enumerate(ACTS):
            pe = m.submodules[f"pe{i}"] = UnitPE()
            m.d.comb += [
                pe.a.eq(C(int(a), signed(8))),
                pe.nibble.eq(self.nibble),
                pe.is_msb.eq(self.is_msb),
                pe.aug.eq(self.aug),
                self.product[i].eq(pe.product),
            ]
        return m


class _SlicePairArray(wiring.Component):
    """256 slice pairs (even lane: MSB or, in LSB_ONLY, LSB nibble; odd lane: LSB nibble; lane
    controls from :func:`lane_controls`) + a SliceCombiner each; pair i has activation i - 128.
    ``out`` is the combiner's even output: the INT8 product as the datapath forms it."""

    def __init__(self):
        super().__init__({
            "q": In(signed(8)),
            "mode": In(TileMode),
            "out": Out(data.ArrayLayout(signed(PRODUCT_SHAPE.width + 4), len(ACTS))),
            "odd": Out(data.ArrayLayout(signed(PRODUCT_SHAPE.width + 4), len(ACTS))),
        })

    def elaborate(self, platform):
        m = Module()
        msb_nib, lsb_nib = self.q[4:8], self.q[0:4]
        even_nib = Mux(self.mode == TileMode.LSB_ONLY, lsb_nib, msb_nib)
        even_msb, even_aug = lane_controls(self.mode, 0)
        odd_msb, odd_aug = lane_controls(self.mode, 1)
        for i, a in enumerate(ACTS):
            pe0 = m.submodules[f"pe{i}_0"] = UnitPE()
            pe1 = m.submodules[f"pe{i}_1"] = UnitPE()
            comb = m.submodules[f"comb{i}"] = SliceCombiner(width=PRODUCT_SHAPE.width)
            m.d.comb += [
                pe0.a.eq(C(int(a), signed(8))), pe1.a.eq(C(int(a), signed(8))),
                pe0.nibble.eq(even_nib), pe1.nibble.eq(lsb_nib),
                pe0.is_msb.eq(even_msb), pe0.aug.eq(even_aug),
                pe1.is_msb.eq(odd_msb), pe1.aug.eq(odd_aug),
                comb.mode.eq(self.mode), comb.even.eq(pe0.product), comb.odd.eq(pe1.product),
                self.out[i].eq(comb.out_even),
                self.odd[i].eq(comb.out_odd),
            ]
        return m


def _run_comb(dut, bench):
    sim = Simulator(dut)
    sim.add_testbench(bench)
    sim.run()


def _read(ctx, array_signal):
    value = ctx.get(array_signal)
    return np.array([value[i] for i in range(len(ACTS))], np.int64)


def test_unit_pe_ports_and_latency():
    pe = UnitPE()
    assert pe.latency == 0
    assert pe.product.shape() == signed(13)
    assert pe.a.shape() == signed(8)
    # Combinational (latency 0): it elaborates to comb statements only, no registers.
    fragment = Fragment.get(pe, None)
    assert set(fragment.statements) == {"comb"} and not fragment.subfragments
    for width in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="width: expected a positive integer"):
            SliceCombiner(width=width)


def test_unit_pe_exhaustive():
    """256 activations x 16 nibbles x {MSB aug 0, MSB aug 1, LSB} = 12288 products."""
    t0 = time.perf_counter()
    dut = _PEArray()
    checked = []

    async def bench(ctx):
        for nib in range(16):
            msb = nib - 16 if nib >= 8 else nib
            for is_msb, aug, field in ((1, 0, msb_field(msb, 0)), (1, 1, msb_field(msb, 1)),
                                       (0, 0, lsb_field(nib)), (0, 1, lsb_field(nib))):
                ctx.set(dut.nibble, nib)
                ctx.set(dut.is_msb, is_msb)
                ctx.set(dut.aug, aug)
                got = _read(ctx, dut.product)
                want = unit_pe(ACTS, field)
                assert np.array_equal(got, want), (nib, is_msb, aug)
                checked.append(len(got))

    _run_comb(dut, bench)
    assert sum(checked) == 256 * 16 * 4
    print(f"unit PE exhaustive: {sum(checked)} products in {time.perf_counter() - t0:.2f} s")


def test_unit_pe_extremes():
    """The product range is exactly [-2032, 2048]: +2048 = (-128) x (msb -8, aug 0)."""
    assert unit_pe(-128, msb_field(-8, 0)) == 2048
    assert unit_pe(127, msb_field(-8, 0)) == -2032
    assert PRODUCT_SHAPE == signed(13)


def test_slice_pair_exhaustive():
    """256 activations x 256 INT8 weights x 4 modes = 262144 slice-combined products."""
    t0 = time.perf_counter()
    dut = _SlicePairArray()
    count = [0]

    async def bench(ctx):
        for mode in Mode:
            ctx.set(dut.mode, TileMode(int(mode)))
            for q in range(-128, 128):
                ctx.set(dut.q, q)
                got = _read(ctx, dut.out)
                want = slice_product(ACTS, np.int8(q), mode)
                assert np.array_equal(got, want), (mode, q)
                odd = _read(ctx, dut.odd)
                if mode is Mode.FULL:
                    assert not odd.any(), q
                else:   # the odd lane of a non-FULL pair is its own LSB-nibble channel
                    lsb = lsb_slice(np.int8(q))
                    field = (lsb_field(lsb) if mode is Mode.LSB_ONLY else
                             msb_field(np.where(lsb >= 8, lsb.astype(np.int16) - 16, lsb),
                                       int(mode is Mode.DRAFT)))
                    shift = 0 if mode is Mode.LSB_ONLY else 3
                    assert np.array_equal(odd, unit_pe(ACTS, field) << shift), (mode, q)
                count[0] += len(got)

    _run_comb(dut, bench)
    assert count[0] == 256 * 256 * 4
    # Cross-check the golden identity the combiner relies on: FULL gives a*q exactly.
    q = np.arange(-128, 128, dtype=np.int8)
    assert np.array_equal(slice_product(ACTS[:, None], q[None, :], Mode.FULL),
                          ACTS[:, None].astype(np.int32) * q[None, :])
    assert np.array_equal(16 * msb_slice(q).astype(np.int16) + lsb_slice(q), q)
    print(f"slice pair exhaustive: {count[0]} products in {time.perf_counter() - t0:.2f} s")
