"""The command ISA and the PE word layouts: Amaranth layouts (hw.isa) == plain-Python encoder
and formats (elmoe3d.isa) == NumPy packers (sw.golden.asm), bit for bit; field checks name the
op and field."""

import numpy as np
import pytest

from elmoe3d import isa
from elmoe3d.config import ArchConfig, ConfigError, TileConfig, preset
from elmoe3d.hw import isa as hisa
from elmoe3d.hw.layouts import TileMode, tile_beat_layout
from elmoe3d.sw.golden import asm
from elmoe3d.sw.golden.datapath import INT64_MAX, INT64_MIN, Mode

SEED = 20240603

CONFIGS = {
    "small": preset("small"),
    "4x8": ArchConfig(name="4x8", tile=TileConfig(rows=4, lanes=8), wmem_bytes=8192,
                      iomem_bytes=32768),
    "paper": preset("paper-4gb"),
}


@pytest.fixture(params=sorted(CONFIGS))
def cfg(request):
    return CONFIGS[request.param]


def _rng(tag):
    seed = SEED + sum(map(ord, tag))
    print(f"seed {seed}")
    return np.random.default_rng(seed)


def _random_fields(op, rng):
    out = {}
    for f in isa.OPS[op]:
        if f.name == "target":
            out[f.name] = int(rng.choice([int(t) for t in isa.Target]))
        elif f.name == "sink":
            out[f.name] = int(rng.choice([int(s) for s in isa.Sink]))
        elif f.name == "src":
            out[f.name] = int(rng.choice([int(s) for s in isa.Source]))
        else:
            out[f.name] = int(rng.integers(0, 1 << f.width))
    return out


@pytest.mark.parametrize("op", list(isa.Op), ids=lambda o: o.name)
def test_command_layout_matches_encode(op):
    rng = _rng(op.name)
    layout = hisa.command_layout()
    assert layout.size == isa.COMMAND_BITS
    member = layout["args"].shape.members[op.name.lower()]
    for trial in range(50):
        fields = _random_fields(op, rng)
        if trial == 0:
            fields = {f.name: (1 << f.width) - 1 for f in isa.OPS[op]}
            fields.update({k: 0 for k in ("target", "sink", "src") if k in fields})
        args = {}
        for name, value in fields.items():
            shape = member[name].shape
            args[name] = shape(value) if hasattr(shape, "__members__") else value
        bits = layout.const({"op": hisa.OpCode(int(op)),
                             "args": {op.name.lower(): args}}).as_bits()
        word = isa.encode(op, **fields)
        assert bits == word, (op, fields)
        assert isa.decode(word) == (op, fields)
        view = layout.const({"op": hisa.OpCode(int(op)), "args": {op.name.lower(): args}})
        assert view.op == hisa.OpCode(int(op))


def test_enum_shapes_match_isa():
    assert [(m.name, m.value) for m in hisa.OpCode] == [(m.name, m.value) for m in isa.Op]
    assert [(m.name, m.value) for m in hisa.TargetCode] == \
        [(m.name, m.value) for m in isa.Target]
    assert [(m.name, m.value) for m in hisa.SinkCode] == [(m.name, m.value) for m in isa.Sink]
    assert [(m.name, m.value) for m in hisa.SourceCode] == \
        [(m.name, m.value) for m in isa.Source]
    assert [(m.name, m.value) for m in TileMode] == [(m.name, m.value) for m in Mode]
    assert [(m.name, m.value) for m in hisa.OKind] == [(m.name, m.value) for m in isa.OKind]
    assert hisa.o_beat_layout(preset("small"))["kind"].shape is hisa.OKind
    gemm = hisa.op_layout(isa.Op.GEMM)
    assert gemm["mode"].shape is TileMode and gemm["sink"].shape is hisa.SinkCode
    assert hisa.op_layout(isa.Op.LOAD)["target"].shape is hisa.TargetCode
    assert hisa.op_layout(isa.Op.LOAD)["src"].shape is hisa.SourceCode
    # fields appended for multi-PE work keep the older fields' bit positions
    assert [f.name for f in isa.OPS[isa.Op.LOAD]][-2:] == ["src", "hb_addr"]
    assert [f.name for f in isa.OPS[isa.Op.GEMM]][-5:] == ["rq_wait", "psum_in", "acc_cont",
                                                         "acc_hold", "max_keep"]
    assert isa.Target.ROWMAX == 7 and [int(s) for s in isa.Source] == [0, 1, 2]


@pytest.mark.parametrize("op,fields,words", [
    (isa.Op.LOAD, {"words": 1 << 16}, ("LOAD.words", "16 bits")),
    (isa.Op.GEMM, {"groups": -1}, ("GEMM.groups",)),
    (isa.Op.GEMM, {"stride": 1 << 16}, ("GEMM.stride",)),
    (isa.Op.REQUANT, {"bogus": 1}, ("REQUANT", "bogus")),
    (isa.Op.BARRIER, {"x": 0}, ("BARRIER", "x")),
])
def test_bad_fields_raise_naming_op_and_field(op, fields, words):
    with pytest.raises(isa.IsaError) as exc:
        isa.encode(op, **fields)
    for w in words:
        assert w in str(exc.value)


def test_decode_rejects_unknown_opcode_and_stray_bits():
    with pytest.raises(isa.IsaError, match="unknown opcode"):
        isa.decode(15)
    with pytest.raises(isa.IsaError, match="BARRIER"):
        isa.decode(int(isa.Op.BARRIER) | (1 << 100))


# ---- PE configuration ----------------------------------------------------------------------------

def test_pe_config_figures():
    pe = preset("small").pe
    assert (pe.rows, pe.lanes, pe.word_bits) == (2, 4, 512)
    assert pe.wmem_words == 8192 // 4 // 64 and pe.wscale_words == pe.wmem_words // 8
    total = pe.act_words + pe.tok_words + pe.hbuf_words + pe.out_words
    assert total * pe.word_bytes == preset("small").iomem_bytes
    paper = preset("paper-8gb").pe
    assert paper.word_bits == 4096 and paper.wmem_words == (32 << 10) // 4 // 512


@pytest.mark.parametrize("rows,lanes,match", [(1, 2, "lanes % 4"), (4, 4, "lanes == 2 \\* rows"),
                                              (2, 8, "lanes == 2 \\* rows")])
def test_pe_config_rejects_tile_shapes(rows, lanes, match):
    arch = ArchConfig(tile=TileConfig(rows=rows, lanes=lanes))
    with pytest.raises(ConfigError, match=match):
        arch.pe


def test_pe_config_rejects_memory_sizes():
    with pytest.raises(ConfigError, match="wmem_bytes"):
        ArchConfig(wmem_bytes=1000).pe
    with pytest.raises(ConfigError, match="iomem_bytes"):
        ArchConfig(iomem_bytes=64 * 31).pe


# ---- memory words: NumPy packers == Amaranth layouts ---------------------------------------------

def _const_int(layout, value):
    return layout.const(value).as_bits()


def test_wgt_and_act_words_match_tile_layout(cfg):
    rng = _rng("wgt" + cfg.name)
    pe = cfg.pe
    beat = tile_beat_layout(TileConfig(rows=pe.rows, lanes=pe.lanes))
    nib = rng.integers(0, 16, (3, pe.lanes, 32)).astype(np.uint8)
    act = rng.integers(-128, 128, (3, pe.rows, 32)).astype(np.int8)
    wgt_words = asm.words_to_ints(asm.pack_wgt(nib, cfg))
    act_words = asm.words_to_ints(asm.pack_act(act, cfg))
    for i in range(3):
        assert wgt_words[i] == _const_int(beat["wgt"].shape, nib[i].tolist())
        assert wgt_words[i] == _const_int(hisa.wgt_word_layout(cfg), nib[i].tolist())
        assert act_words[i] == _const_int(beat["act"].shape, act[i].tolist())
        assert act_words[i] == _const_int(hisa.act_word_layout(cfg), act[i].tolist())
        assert wgt_words[i] < (1 << pe.word_bits) and act_words[i] < (1 << pe.word_bits)
    assert np.array_equal(asm.unpack_wgt(asm.ints_to_words(wgt_words, cfg), cfg), nib)
    assert np.array_equal(asm.unpack_act(asm.ints_to_words(act_words, cfg), cfg), act)


def test_scale_word_matches_layout(cfg):
    rng = _rng("scale" + cfg.name)
    bits = rng.integers(0, 1 << 16, (2, 8, cfg.pe.lanes)).astype(np.uint16)
    words = asm.words_to_ints(asm.pack_scales(bits, cfg))
    for i in range(2):
        assert words[i] == _const_int(hisa.scale_word_layout(cfg), bits[i].tolist())
    assert np.array_equal(asm.unpack_scales(asm.pack_scales(bits, cfg), cfg), bits)


def test_tok_word_matches_layout(cfg):
    rng = _rng("tok" + cfg.name)
    pe = cfg.pe
    n = pe.tok_per_word + 3
    ent = {"e_x": rng.integers(-128, 128, n), "e_h": rng.integers(-128, 128, n),
           "gate": rng.integers(0, 1 << 16, n).astype(np.uint16),
           "slot": rng.integers(0, 256, n)}
    words = asm.words_to_ints(asm.pack_tok(ent, cfg))
    assert len(words) == 2
    layout = hisa.tok_word_layout(cfg)
    assert hisa.tok_entry_layout().size == 64
    for w in range(2):
        entries = []
        for j in range(pe.tok_per_word):
            k = w * pe.tok_per_word + j
            entries.append({name: int(ent[name][k]) for name in ent} if k < n else {})
        assert words[w] == _const_int(layout, entries)
    back = asm.unpack_tok(asm.pack_tok(ent, cfg), cfg)
    for name in ent:
        assert np.array_equal(back[name][:n], ent[name])
    assert not back["slot"][n:].any()


def test_value_words_match_layouts(cfg):
    rng = _rng("values" + cfg.name)
    pe = cfg.pe
    q16 = rng.integers(-(1 << 31), 1 << 31, (2, pe.q16_per_word)).astype(np.int32)
    q24 = rng.integers(INT64_MIN, INT64_MAX, (2, pe.q24_per_word), dtype=np.int64)
    f32 = rng.standard_normal((2, pe.fp32_per_beat)).astype(np.float32)
    for i, w in enumerate(asm.words_to_ints(asm.pack_q16(q16, cfg))):
        assert w == _const_int(hisa.hbuf_word_layout(cfg), q16[i].tolist())
    for i, w in enumerate(asm.words_to_ints(asm.pack_q24(q24, cfg))):
        assert w == _const_int(hisa.out_word_layout(cfg), q24[i].tolist())
    for i, w in enumerate(asm.words_to_ints(asm.pack_fp32(f32, cfg))):
        assert w == _const_int(hisa.fp32_word_layout(cfg), f32[i].view(np.uint32).tolist())
    assert np.array_equal(asm.unpack_q16(asm.pack_q16(q16, cfg), cfg), q16)
    assert np.array_equal(asm.unpack_q24(asm.pack_q24(q24, cfg), cfg), q24)
    assert np.array_equal(asm.unpack_fp32(asm.pack_fp32(f32, cfg), cfg).view(np.uint32),
                          f32.view(np.uint32))


def test_status_and_o_beat_match_layouts(cfg):
    rng = _rng("status" + cfg.name)
    values = {name: int(rng.integers(0, 1 << bits)) for name, bits in isa.STATUS_FIELDS}
    word = asm.pack_status(values, cfg)
    layout = hisa.status_layout(cfg)
    assert layout.size == cfg.pe.word_bits
    assert word == _const_int(layout, values)
    assert asm.unpack_status(word) == values
    beat = asm.OBeat(isa.OKind.STATUS, word)
    olay = hisa.o_beat_layout(cfg)
    assert beat.as_int() == _const_int(olay, {"kind": hisa.OKind.STATUS, "data": word})
    assert asm.OBeat.from_int(beat.as_int()) == beat
    with pytest.raises(ValueError, match="STATUS.gemm_beats"):
        asm.pack_status({"gemm_beats": 1 << 48}, cfg)


def test_asm_formats_are_the_isa_ones():
    """The assembler re-exports the ISA's formats under their old names (one definition)."""
    for name in ("OKind", "TOK_FIELDS", "STATUS_FIELDS", "TIMING_STATUS_FIELDS",
                 "FUNCTIONAL_STATUS_FIELDS", "W_TARGETS"):
        assert getattr(asm, name) is getattr(isa, name), name
    assert asm.TOK_DTYPE.names == tuple(name for name, _, _ in isa.TOK_FIELDS)
    assert asm.TOK_DTYPE.itemsize * 8 == isa.TOK_ENTRY_BITS == hisa.tok_entry_layout().size


# ---- the assembler -------------------------------------------------------------------------------

def test_program_encode_decode_roundtrip():
    cfg = preset("small")
    p = asm.Program(cfg)
    p.clear(out=True, rowmax=True, flags=True, counters=True)
    p.load("TOK", 0, 1)
    p.load(isa.Target.ACT, 0, 4)
    p.load(isa.Target.WMSB, 0, 4, buf=1)
    p.load(isa.Target.WSCALE, 0, 1, buf=1, signal=True)
    p.load(isa.Target.WMSB, 0, 1, buf=0)             # the RAW GEMM's words (sync rule 6)
    p.load(isa.Target.WSCALE, 0, 1, buf=0, signal=True)
    p.gemm(mode=Mode.DRAFT, wbuf=1, act_base=0, w_base=0, row_blocks=2, col_blocks=2,
           groups=2, sink="SWIGLU", stride=2, wait=True, release=True)
    p.requant(row_blocks=2, channels=32, act_base=0, tok_base=0)
    p.output(row_blocks=1, channels=16)
    hb_top = (1 << next(f.width for f in isa.OPS[isa.Op.LOAD] if f.name == "hb_addr")) - 1
    p.load("ACT", 8, 2, src="HB", hb_addr=hb_top)
    p.gemm(mode=Mode.MSB_ONLY, wbuf=0, act_base=0, w_base=0, row_blocks=1, col_blocks=1,
           groups=1, sink="RAW", psum_in=True, wait=True, release=True)
    p.send("ROWMAX", 0, 2)
    p.recv(isa.Target.ROWMAX, 6, 2, accumulate=True)
    p.barrier()
    p.status()
    words = p.encode()
    assert all(0 <= w < (1 << isa.COMMAND_BITS) for w in words)
    q = asm.Program.decode(words, cfg)
    assert [c for c in q] == [c for c in p]
    assert p.counts()["LOAD"] == 7 and p.counts()["GEMM SWIGLU"] == 1
    assert p.counts()["GEMM psum_in"] == 1
    assert q[10].fields["src"] == isa.Source.HB and q[10].fields["hb_addr"] == hb_top
    p.check_sync()
    assert "GEMM" in p.listing() and "src=HB" in p.listing() and "target=ROWMAX" in p.listing()


@pytest.mark.parametrize("build,match", [
    (lambda p: p.load("ACT", 60, 5), r"command 0: LOAD.addr = 60: ACT addr \+ words"),
    (lambda p: p.load("WMSB", 0, 33), r"command 0: LOAD.addr = 0: WMSB"),
    (lambda p: p.load("ACT", 0, 1, signal=True), r"command 0: LOAD.signal = 1"),
    (lambda p: p.load("ACT", 0, 0), r"command 0: LOAD.words = 0"),
    (lambda p: p.load("FOO", 0, 1), r"command 0: LOAD.target = 'FOO'"),
    (lambda p: p.gemm(mode=0, wbuf=0, act_base=0, w_base=30, row_blocks=1, col_blocks=2,
                      groups=2, sink=0, stride=1), r"command 0: GEMM.w_base = 30"),
    (lambda p: p.load("ROWMAX", 0, 1), r"command 0: LOAD.target = 7: LOAD does not address"),
    (lambda p: p.append(isa.Op.LOAD, target=3, words=1, src=3),
     r"command 0: LOAD.src = 3: unknown source"),
    (lambda p: p.load("ACT", 0, 1, src="DRAM"), r"command 0: LOAD.src = 'DRAM'"),
    (lambda p: p.recv("ROWMAX", 7, 2), r"command 0: RECV.addr = 7: ROWMAX addr \+ words"),
    (lambda p: p.recv("HBUF", 0, 1, accumulate=True), r"command 0: RECV.accumulate = 1"),
    (lambda p: p.gemm(mode=Mode.DRAFT, wbuf=0, act_base=0, w_base=0, row_blocks=1,
                      col_blocks=20, groups=1, sink="SWIGLU", stride=2),
     r"command 0: GEMM.out_base = 0: channels"),
    (lambda p: p.gemm(mode=Mode.DRAFT, wbuf=0, act_base=0, w_base=0, row_blocks=1,
                      col_blocks=1, groups=1, sink="COMBINE", stride=0),
     r"command 0: GEMM.stride = 0"),
    (lambda p: p.gemm(mode=Mode.FULL, wbuf=0, act_base=0, w_base=0, row_blocks=1,
                      col_blocks=1, groups=1, sink="COMBINE", out_base=1, stride=2),
     r"command 0: GEMM.out_base = 1: must be a multiple of the 2 channels"),
    (lambda p: p.gemm(mode=Mode.DRAFT, wbuf=0, act_base=0, w_base=0, row_blocks=1,
                      col_blocks=1, groups=1, sink="SWIGLU", out_base=3, stride=2),
     r"command 0: GEMM.out_base = 3: must be a multiple of the 2 channels"),
    (lambda p: p.requant(row_blocks=1, channels=40, act_base=0, tok_base=0),
     r"command 0: REQUANT.channels = 40"),
    (lambda p: p.output(row_blocks=100, channels=64), r"command 0: OUTPUT.row_blocks = 100"),
    (lambda p: p.recv("ACT", 0, 1, accumulate=True), r"command 0: RECV.accumulate = 1"),
    (lambda p: p.send("WMSB", 0, 1), r"command 0: SEND.target = 0"),
    (lambda p: p.append(isa.Op.GEMM, groups=256), r"command 0: GEMM.groups = 256 does not fit"),
])
def test_program_field_errors_name_command_and_field(build, match):
    p = asm.Program(preset("small"))
    with pytest.raises(asm.ProgramError, match=match):
        build(p)
