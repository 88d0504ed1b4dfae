"""The one rule for a user's integers and reals (``elmoe3d.checks``) and the places that now
share it: a bool is never a count, a NumPy integer is one except where Amaranth needs a Python
int (hardware parameters), and the error names the parameter and the range."""

import re
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from elmoe3d.checks import (check_int, expected_int, is_int, is_real, parse_bytes, parse_int,
                            python_int_hint)
from elmoe3d.config import TileConfig, preset
from elmoe3d.hw.board import BoardTop
from elmoe3d.hw.bridge import Bridge
from elmoe3d.hw.bridge_bytes import ByteWordFIFO
from elmoe3d.hw.bridge_rx import Deframer
from elmoe3d.hw.checked import check_param, inspection
from elmoe3d.hw.die_layouts import die_errors_layout
from elmoe3d.hw.dram import DramController
from elmoe3d.hw.ext_stream import ExtStreamer
from elmoe3d.hw.pe.common import check_choice, check_word_bits
from elmoe3d.hw.pe.gemm import GemmIssue
from elmoe3d.hw.pe.load import LoadEngine
from elmoe3d.hw.ring import StreamlineRing
from elmoe3d.hw.tile import TensorTile
from elmoe3d.hw.uart import UartRx
from elmoe3d.hw.vpu import SwiGLUUnit
from elmoe3d.sw.golden.agg_link import reduce_add_words
from elmoe3d.sw.golden.quant import QuantizationError, quantize_weights
from elmoe3d.sw.golden.ring import RingFlit, ring_flits, ring_geometry
from elmoe3d.sw.golden.vpu import sat
from elmoe3d.sw.host.compiler import HomeGroups
from elmoe3d.sw.host.fpga import StepClock
from elmoe3d.sw.host.parallel import group_routing
from elmoe3d.synth.sram import sram_area


BOOLS = [True, False, np.True_, np.False_]
NUMPY_INTS = [np.int8(3), np.int64(3), np.uint16(3), np.intp(3)]
NOT_NUMBERS = [None, "3", b"3", [3], (3,), {3: 3}, np.array([3]), 3 + 0j]


@pytest.mark.parametrize("v", BOOLS)
def test_a_bool_is_neither_an_int_nor_a_real(v):
    assert not is_int(v) and not is_int(v, numpy=False) and not is_real(v)


@pytest.mark.parametrize("v", NUMPY_INTS)
def test_numpy_integers_are_ints_unless_python_ints_are_asked_for(v):
    assert is_int(v) and is_real(v)
    assert not is_int(v, numpy=False)


@pytest.mark.parametrize("v", NOT_NUMBERS + [3.0, np.float32(3), float("nan")])
def test_floats_and_other_objects_are_not_ints(v):
    assert not is_int(v) and not is_int(v, numpy=False)


@pytest.mark.parametrize("v", NOT_NUMBERS)
def test_other_objects_are_not_reals(v):
    assert not is_real(v)


@pytest.mark.parametrize("v", [3.5, np.float16(3.5), float("nan"), float("inf"), -2, np.int64(-2)])
def test_reals_take_nan_and_infinity_and_integers(v):
    assert is_real(v)


@given(st.integers(-10**30, 10**30), st.integers(-50, 50), st.integers(0, 50))
def test_check_int_takes_exactly_the_range(v, lo, span):
    hi = lo + span
    inside = lo <= v <= hi
    if inside:
        out = check_int("n", v, lo, hi)
        assert out == v and type(out) is int
    else:
        with pytest.raises(ValueError, match=rf"^n: expected an integer in {lo}\.\.{hi}, "
                                             rf"got {v}$"):
            check_int("n", v, lo, hi)


def test_check_int_returns_a_python_int_for_a_numpy_one():
    out = check_int("rows", np.uint8(200), 1)
    assert out == 200 and type(out) is int


@pytest.mark.parametrize("lo, hi, words", [
    (1, None, "a positive integer"), (0, None, "an integer >= 0"), (8, None, "an integer >= 8"),
    (None, None, "an integer"), (0, 15, "an integer in 0..15"), (None, 7, "an integer <= 7")])
def test_expected_words(lo, hi, words):
    assert expected_int(lo, hi) == words


def test_check_int_raises_the_callers_error_type():
    with pytest.raises(QuantizationError, match=r"^bits: expected an integer in 2\.\.8, got True$"):
        check_int("bits", True, 2, 8, error=QuantizationError)


@pytest.mark.parametrize("text, lo, hi, out", [
    ("3", 1, None, 3), (" 12 ", 1, None, 12), ("-3", None, -1, -3), ("0", 0, 0, 0),
    ("0", 1, None, "--n: expected a positive integer, got 0"),
    ("abc", 1, None, "--n: expected a positive integer, got 'abc'"),
    ("", 1, None, "--n: expected a positive integer, got ''"),
    ("2.0", 1, None, "--n: expected a positive integer, got '2.0'"),
    ("16", 0, 15, "--n: expected an integer in 0..15, got 16"),
])
def test_parse_int_reads_a_command_lines_integer_with_check_ints_words(text, lo, hi, out):
    if isinstance(out, int):
        assert parse_int("--n", text, lo, hi) == out and type(parse_int("--n", text, lo, hi)) is int
    else:
        with pytest.raises(KeyError, match=f"^{re.escape(repr(out))}$"):
            parse_int("--n", text, lo, hi, error=KeyError)


def test_a_hardware_parameter_names_a_numpy_integer():
    with pytest.raises(ValueError, match=r"^pes: expected a positive integer \(a Python int\), "
                                         r"got np\.int64\(4\)$"):
        check_param("pes", np.int64(4))
    assert check_param("pes", 4) == 4


@pytest.mark.parametrize("build", [
    lambda: Bridge(config=preset("small"), cmd_depth=np.int64(16)),
    lambda: ByteWordFIFO(depth=np.int64(16), word_bytes=64),
    lambda: Deframer(max_body=np.int64(64)),
    lambda: ExtStreamer(pes=4, word_bits=np.int64(512), flit_bytes=128, stream_bits=4),
    lambda: StreamlineRing(pes=np.int64(4), pes_per_group=4, word_bits=512, flit_bytes=32),
], ids=["Bridge", "ByteWordFIFO", "Deframer", "ExtStreamer", "StreamlineRing"])
def test_a_hardware_block_names_a_numpy_integer_parameter(build):
    """A NumPy integer passed Bridge's, ByteWordFIFO's, Deframer's and ExtStreamer's checks
    (after the first cut of the one rule) and Amaranth refused it inside the block ("FIFO
    depth must be a non-negative integer, not np.int64(16)"); each names its parameter."""
    with inspection(), pytest.raises(ValueError, match=r"^\w+: expected .*, got np\.int64\("):
        build()


@pytest.mark.parametrize("v", NUMPY_INTS)
def test_the_python_int_hint_is_for_numpy_integers_only(v):
    assert python_int_hint(v) == " (a Python int)"
    for other in (3, True, np.True_, 3.0, "3", None):
        assert python_int_hint(other) == ""


@pytest.mark.parametrize("build", [
    lambda: UartRx(divisor=np.int64(100)),
    lambda: SwiGLUUnit(tag_width=np.int64(4)),
    lambda: DramController(dram=preset("small").hb, clock_ghz=1.0,
                           queue_depth=np.int64(16)),
    lambda: die_errors_layout(preset("small"), ext_channels=np.int64(2)),
    lambda: check_choice("passes", np.int64(2), (1, 2, 4)),
    lambda: check_word_bits(np.int64(512)),
    lambda: GemmIssue(tile=TileConfig(), word_bits=512, passes=1, weight_parts=1, act_parts=1,
                      wbuf_memories=1, wmem_words=np.int64(64), wscale_words=8),
    lambda: GemmIssue(tile=TileConfig(), word_bits=512, passes=1, weight_parts=1, act_parts=1,
                      wbuf_memories=1, wmem_words=64, wscale_words=8, low_words=np.int64(8)),
    lambda: LoadEngine(word_bits=512, low_words=np.int64(8)),
    lambda: TensorTile(config=TileConfig(), passes=np.int64(2)),
    lambda: BoardTop(config=preset("small"), clk_hz=100_000_000, hb_words=np.int64(512)),
    lambda: BoardTop(config=preset("small"), clk_hz=np.int64(100_000_000)),
    lambda: ring_geometry(word_bits=np.int64(512), flit_bytes=32),
    lambda: ring_geometry(word_bits=512, flit_bytes=np.int64(32)),
    lambda: reduce_add_words([[0]], word_bits=np.int64(512)),
    lambda: replace(preset("small"), pes=np.int64(16)),
], ids=["UartRx", "SwiGLUUnit", "DramController", "die_errors_layout", "check_choice",
        "check_word_bits", "GemmIssue wmem_words", "GemmIssue low_words", "LoadEngine",
        "TensorTile", "BoardTop hb_words", "BoardTop clk_hz", "ring_geometry word_bits",
        "ring_geometry flit_bytes", "reduce_add_words", "ArchConfig"])
def test_a_hardware_check_with_its_own_words_names_a_numpy_integer(build):
    """Checks whose words are their own (a power of two, a choice, a minimum with its unit)
    refused a NumPy integer as if its value were wrong ("divisor: expected an integer >= 4
    (clock cycles per bit), got np.int64(100)"); they now say it must be a Python int."""
    with inspection(), pytest.raises((ValueError, TypeError),
                                     match=r"^\w+: expected .*\(a Python int\), "
                                           r"got np\.int64\("):
        build()


def test_the_ring_geometry_refuses_a_numpy_width_rather_than_cut_the_data():
    # with np.int64 word_bits the flit's wide-int shifts wrapped: words 1..4 became data 0x1
    with pytest.raises(ValueError, match=r"^word_bits: expected a positive multiple of 8"):
        ring_flits([1, 2, 3, 4], 1, word_bits=np.int64(64), flit_bytes=32)
    flits = ring_flits([1, 2, 3, 4], 1, word_bits=64, flit_bytes=32)
    assert [f.data for f in flits] == [1 | 2 << 64 | 3 << 128 | 4 << 192]


def test_stored_counts_are_python_ints():
    groups = HomeGroups(np.int64(4))
    assert groups.groups == 4 and type(groups.groups) is int


def test_quantize_weights_refuses_bits_true_or_a_numpy_bool():
    for bits in (True, np.True_):
        with pytest.raises(QuantizationError,
                           match=f"bits must be an integer in 2..8, got {bits!r}"):
            quantize_weights(np.ones((4, 32), np.float32), bits=bits)


# Places that took a bool as 1 before the one rule (each ran: a saturation to True = 1 bit, a
# PE memory of True words as a one-word memory, True as expert 1 of a group, a flit of True
# valid words, an SRAM True bits wide, a flit of True bytes, True home groups, a board clock
# ticking True seconds).

def test_sat_refuses_bits_true():
    with pytest.raises(ValueError, match=r"^sat: bits must be an integer in 1\.\.64, got True$"):
        sat(np.array([3]), True)


def test_ring_flit_refuses_words_true():
    with pytest.raises(ValueError, match=r"^words: expected 1\.\.\d+ valid word slots, got True$"):
        RingFlit(data=0, dst_mask=1, words=True).check(pes=4, word_bits=512, flit_bytes=64,
                                                         stream_bits=4)


def test_group_routing_refuses_expert_true():
    routing = (np.array([[0, 1]]), np.array([[0.5, 0.5]], np.float16))
    with pytest.raises(ValueError, match=r"^group_experts: expert id True is not in 0\.\.7$"):
        group_routing(routing, 1, 8, group_experts=[True])


def test_gemm_issue_refuses_a_memory_of_true_words():
    with inspection(), pytest.raises(ValueError, match=r"^wmem_words: expected a positive integer"):
        GemmIssue(tile=TileConfig(), word_bits=512, passes=1, weight_parts=1, act_parts=1,
                  wbuf_memories=1, wmem_words=True, wscale_words=8)


@pytest.mark.parametrize("call, words", [
    (lambda: sram_area(True, 64), r"^width: expected a positive integer, got True$"),
    (lambda: ring_geometry(word_bits=8, flit_bytes=True),
     r"^flit_bytes: expected a positive integer, got True$"),
    (lambda: HomeGroups(True), r"^groups: expected a positive integer, got True$"),
    (lambda: StepClock(tick=True), r"^tick: expected seconds > 0, got True$"),
], ids=["sram_area", "ring_geometry", "HomeGroups", "StepClock"])
def test_a_bool_is_not_a_size(call, words):
    with pytest.raises(ValueError, match=words):
        call()


@pytest.mark.parametrize("text, out", [
    ("4000000", 4_000_000), ("4_000_000", 4_000_000), (" 7 ", 7), ("0", 0),
    ("1e9", 10**9), ("1.5e9", 1_500_000_000), ("1E3", 1000),
    ("512MiB", 512 * 1024**2), ("1.5 GB", 1_500_000_000), ("1giB", 1024**3), ("2kB", 2000),
    ("3KiB", 3072), ("0.5kB", 500), ("10B", 10), ("1TiB", 1024**4), ("0.0009765625KiB", 1),
    ("0.000e30", 0), ("0e99999999999", 0), ("9223372036854775807", 2**63 - 1),
    ("9.223372036854775807e18", 2**63 - 1), ("1." + "0" * 90, 1), ("1.", 1), ("1.e3", 1000),
    ("1" + "0" * 60 + "e-45", 10**15), ("0." + "0" * 64 + "1e70", 10**5), ("1e-0", 1)])
def test_parse_bytes_takes_integers_e_notation_and_units(text, out):
    value = parse_bytes("--dense-bytes", text)
    assert value == out and type(value) is int


@pytest.mark.parametrize("text", ["1.5", "-1", "nan", "inf", "1e-3", "abc", "12 parsecs", "",
                                  "0x10", "1.0000001e3", "0.3KiB", "GB", "1 2", "1__0", "_1",
                                  "\uff11\uff12", "1.00000000000000000000000000001",
                                  "1e-99999999999", "1e-999999999", ".", ".e5", "e5", "kB",
                                  "1500e-3"])
def test_parse_bytes_refuses_a_fraction_of_a_byte_or_no_number(text):
    with pytest.raises(ValueError) as exc:
        parse_bytes("--kv-bytes", text)
    assert str(exc.value) == (f"--kv-bytes: expected a whole number of bytes >= 0 (4000000, "
                              f"1e9, 512MiB or 1.5GB), got {text!r}")


@pytest.mark.parametrize("text, error", [
    ("8Gb", "'8Gb': Gb is a unit of bits; bytes are GB"),
    ("10b", "'10b': b is a unit of bits; bytes are B"),
    ("1e19", "'1e19': beyond 9,223,372,036,854,775,807 bytes"),
    ("9223372036854775808", "'9223372036854775808': beyond 9,223,372,036,854,775,807 bytes"),
    ("1e1000000", "'1e1000000': beyond 9,223,372,036,854,775,807 bytes"),
    ("1e5000", "'1e5000': beyond 9,223,372,036,854,775,807 bytes"),
    ("9" * 5000, f"expected a whole number of bytes >= 0 (4000000, 1e9, 512MiB or 1.5GB), got "
                 f"'{'9' * 40}'..."),
    ("4KB", "'4KB': KB is 1,000 or 1,024 bytes; write kB (1,000) or KiB (1,024)"),
    # all lowercase: bits by the letter, but the paper's "4gb" (paper --hb 4gb) is 4 GiB of
    # bytes (a new user's trial: "4gb is a unit of bits" beside --hb 4gb read as bytes)
    ("4gb", "'4gb': a lowercase b is a bit; for bytes write GB (10^9) or GiB (2^30)"),
    ("4gib", "'4gib': a lowercase b is a bit; for bytes write GB (10^9) or GiB (2^30)"),
    ("3kb", "'3kb': a lowercase b is a bit; for bytes write kB (10^3) or KiB (2^10)"),
    ("1tb", "'1tb': a lowercase b is a bit; for bytes write TB (10^12) or TiB (2^40)"),
    ("2Mb", "'2Mb': Mb is a unit of bits; bytes are MB"),
    ("12345678901234567890123456789", "'12345678901234567890123456789': beyond "
                                      "9,223,372,036,854,775,807 bytes")])
def test_parse_bytes_names_bits_and_counts_beyond_int64(text, error):
    """A review: ``1e1000000`` raised decimal.Overflow (an internal error), ``1e5000`` int()'s
    4,300-digit limit, a 29-digit count was rounded to 28 digits, and ``8Gb`` (gigabits, a
    DRAM datasheet's unit) was read as gigabytes; a second review: ``1e-999999999`` built
    10^999999999, and ``KB`` was read as 1,000 where the tool prints KB for 1,024."""
    with pytest.raises(ValueError) as exc:
        parse_bytes("--dense-bytes", text)
    assert str(exc.value) == f"--dense-bytes: {error}"
