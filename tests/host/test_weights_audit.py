"""Audit fixes of the weight-file reader (elmoe3d.sw.host.weights): one safetensors header
check for every file, whatever the dtypes (a BF16 tensor skipped the library's checks), and
corrupt headers refused with a UserError instead of a raw OverflowError / ValueError /
RecursionError."""

import json
import struct

import numpy as np
import pytest
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

import elmoe3d.cli as cli
from elmoe3d.errors import UserError
from elmoe3d.sw.host.weights import decode_bf16, load_tensors, open_tensors

ONES = {"F32": np.ones(64, "<f4").tobytes(), "BF16": b"\x80\x3f" * 64}   # 64 values of 1.0
SIZE = {"F32": 4, "BF16": 2}


def write_st(path, header, data=b""):
    """A safetensors file with ``header`` (a dict, or raw JSON bytes) and the data section
    ``data`` written as given."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def corrupt_cases(dtype):
    """(id, header, data, message) of corrupt files, for tensors of ``dtype``; 128 values
    (2 x 64) of the dtype are ``n`` bytes."""
    n = 64 * SIZE[dtype]
    ones = ONES[dtype]
    return [
        ("trailing bytes", {"w": entry(dtype, [2, 32], 0, n)}, ones + b"GARBAGE!",
         "tensor 'w': the last tensor's data ends at byte END but the file has SIZE bytes: "
         "8 bytes follow it (corrupt, or not a safetensors file)"),
        ("hole before", {"w": entry(dtype, [2, 32], n, 2 * n)}, ones * 2,
         f"tensor 'w': data_offsets [{n}, {2 * n}]: a hole of {n} bytes between the start of "
         f"the data (offset 0) and this tensor (corrupt header)"),
        ("hole between", {"a": entry(dtype, [1, 32], 0, n // 2),
                          "b": entry(dtype, [1, 32], n, 3 * n // 2)}, ones + ones[:n // 2],
         f"tensor 'b': data_offsets [{n}, {3 * n // 2}]: a hole of {n // 2} bytes between the "
         f"end of tensor 'a' (offset {n // 2}) and this tensor (corrupt header)"),
        ("overlap", {"a": entry(dtype, [2, 32], 0, n), "b": entry(dtype, [2, 32], 0, n)}, ones,
         "overlap the data of tensor '"),
        ("float shape", {"w": entry(dtype, [2.9, 32], 0, n)}, ones,
         "tensor 'w': shape[0]: expected an integer >= 0, got 2.9"),
        ("integral float shape", {"w": entry(dtype, [2.0, 32], 0, n)}, ones,
         "tensor 'w': shape[0]: expected an integer >= 0, got 2.0"),
        ("string shape", {"w": entry(dtype, ["2", "32"], 0, n)}, ones,
         "tensor 'w': shape[0]: expected an integer >= 0, got '2'"),
        ("bool shape", {"w": entry(dtype, [2, True], 0, n)}, ones,
         "tensor 'w': shape[1]: expected an integer >= 0, got True"),
        ("shape not a list", {"w": entry(dtype, "2x32", 0, n)}, ones,
         "tensor 'w': shape: expected a list of integers >= 0, got '2x32'"),
        ("string offset", {"w": entry(dtype, [2, 32], "0", n)}, ones,
         "tensor 'w': data_offsets[0]: expected an integer >= 0, got '0'"),
        ("negative offset", {"w": entry(dtype, [2, 32], -n, 0)}, ones,
         f"tensor 'w': data_offsets[0]: expected an integer >= 0, got {-n}"),
        ("end before begin", {"w": entry(dtype, [2, 32], n, 0)}, ones,
         f"tensor 'w': data_offsets[1]: expected an integer >= {n}, got 0"),
        ("three offsets", {"w": {"dtype": dtype, "shape": [2, 32], "data_offsets": [0, n, n]}},
         ones, f"tensor 'w': data_offsets: expected [begin, end], got [0, {n}, {n}]"),
        ("size mismatch", {"w": entry(dtype, [4, 32], 0, n)}, ones,
         f"tensor 'w': data_offsets [0, {n}] hold {n} bytes but {dtype} [4, 32] needs "
         f"{2 * n}: corrupt header"),
        ("no dtype", {"w": {"shape": [2, 32], "data_offsets": [0, n]}}, ones,
         "tensor 'w': malformed header entry {'data_offsets': [0, "),
        ("metadata list", {"__metadata__": [1, 2], "w": entry(dtype, [2, 32], 0, n)}, ones,
         "header: __metadata__: expected an object of strings, got [1, 2] (corrupt "
         "safetensors file)"),
        ("metadata value", {"__metadata__": {"format": 1}, "w": entry(dtype, [2, 32], 0, n)},
         ones, "header: __metadata__: expected an object of strings, got {'format': 1}"),
        ("infinite shape", f'{{"w": {{"dtype": "{dtype}", "shape": [Infinity, 32], '
                           f'"data_offsets": [0, {n}]}}}}'.encode(), ones,
         "header is not valid JSON: Infinity is not a JSON number (corrupt, or not a "
         "safetensors file)"),
        ("NaN shape", f'{{"w": {{"dtype": "{dtype}", "shape": [NaN, 32], '
                      f'"data_offsets": [0, {n}]}}}}'.encode(), ones,
         "header is not valid JSON: NaN is not a JSON number"),
        ("1e400 offset", f'{{"w": {{"dtype": "{dtype}", "shape": [2, 32], '
                         f'"data_offsets": [0, 1e400]}}}}'.encode(), ones,
         "tensor 'w': data_offsets[1]: expected an integer >= 0, got inf"),
        ("5000-digit integer", f'{{"w": {{"dtype": "{dtype}", "shape": [2, {"9" * 5000}], '
                               f'"data_offsets": [0, {n}]}}}}'.encode(), ones,
         "header is not valid JSON: integer 999999999999... (5000 digits) is out of range"),
        ("deep nesting", b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", b"",
         "header is not valid JSON: nested too deeply (corrupt, or not a safetensors file)"),
    ]


CASES = [(dtype, *case) for dtype in ("BF16", "F32") for case in corrupt_cases(dtype)]


@pytest.mark.parametrize("dtype, case, header, data, message", CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_corrupt_header_refused_whatever_the_dtype(tmp_path, dtype, case, header, data,
                                                   message):
    """Before, every one of these loaded from a BF16 file (a wrong shape for 2.9 and "2"),
    or raised a raw OverflowError / ValueError / RecursionError; now both dtypes give the
    same UserError when the file is opened, before any tensor is read."""
    path = write_st(tmp_path / "w.safetensors", header, data)
    size = path.stat().st_size
    message = message.replace("END", str(size - 8)).replace("SIZE", str(size))
    with pytest.raises(UserError) as exc:
        open_tensors(path)
    assert type(exc.value) is UserError
    assert str(exc.value).startswith(f"{path}: ")
    assert message in str(exc.value)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("dtype, case, header, data, message",
                         [c for c in CASES if c[0] == "F32"],
                         ids=[c[1] for c in CASES if c[0] == "F32"])
def test_the_safetensors_library_refuses_the_same_f32_files(tmp_path, dtype, case, header,
                                                            data, message):
    """The rules are the library's: it refuses each of these F32 files too."""
    path = write_st(tmp_path / "w.safetensors", header, data)
    with pytest.raises(SafetensorError):
        load_file(str(path))


def test_a_key_given_twice_keeps_its_last_value_as_the_library_does(tmp_path):
    """A review (2026-12-06): the first form of the header check refused a tensor name, a
    metadata key or an entry field given twice, which the library loads (its parser keeps
    the last value); now they load the same here, and a 30-digit integer in an unknown field
    is taken as the library takes it."""
    ones = np.ones(4, np.float32)
    a = json.dumps(entry("F32", [4], 0, 16))
    header = (f'{{"__metadata__": {{"k": "1", "k": "2"}}, "w": {a}, "w": '
              f'{{"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16], "note": 1, '
              f'"note": {"7" * 30}}}}}').encode()
    path = write_st(tmp_path / "w.safetensors", header, ones.tobytes())
    lib = load_file(str(path))
    ours = load_tensors(path)
    assert list(ours) == list(lib) == ["w"] and lib["w"].shape == (2, 2)
    np.testing.assert_array_equal(ours["w"], lib["w"])
    # a tensor entry's own field twice: the library refuses it, and so does this reader
    bad = write_st(tmp_path / "b.safetensors", header.replace(b'"shape": [2, 2]',
                                                              b'"shape": [4], "shape": [2, 2]'),
                   ones.tobytes())
    with pytest.raises(SafetensorError, match="duplicate field `shape`"):
        load_file(str(bad))
    with pytest.raises(UserError, match=r"tensor 'w': shape given twice in its header entry "
                                        r"\(corrupt safetensors file\)"):
        open_tensors(bad)


def test_the_same_corruption_gives_the_same_message_for_bf16_and_f32(tmp_path):
    got = {}
    for dtype in ("BF16", "F32"):
        n = 64 * SIZE[dtype]
        path = write_st(tmp_path / "w.safetensors",
                        {"a": entry(dtype, [2, 32], 0, n), "b": entry(dtype, [2, 32], 0, n)},
                        ONES[dtype])
        with pytest.raises(UserError) as exc:
            load_tensors(path)
        got[dtype] = str(exc.value).replace(str(n), "N")
    assert got["BF16"] == got["F32"]
    assert got["F32"] == (f"{path}: tensor 'b': data_offsets [0, N] overlap the data of "
                          f"tensor 'a', which ends at N (corrupt header)")


def test_bf16_float_shape_no_longer_truncated_to_a_wrong_shape(tmp_path):
    """``"shape": [2.9, 32]`` loaded as a (2, 32) tensor before; the same bytes with the
    right header load as that tensor, exactly."""
    bad = write_st(tmp_path / "bad.safetensors", {"w": entry("BF16", [2.9, 32], 0, 128)},
                   ONES["BF16"])
    with pytest.raises(UserError, match=r"shape\[0\]: expected an integer >= 0, got 2\.9"):
        load_tensors(bad)
    good = write_st(tmp_path / "good.safetensors", {"w": entry("BF16", [2, 32], 0, 128)},
                    ONES["BF16"])
    got = load_tensors(good)["w"]
    assert got.dtype == np.float32 and got.shape == (2, 32)
    np.testing.assert_array_equal(got, np.ones((2, 32), np.float32))


def test_no_tensor_but_data(tmp_path):
    path = write_st(tmp_path / "w.safetensors", {"__metadata__": {"format": "pt"}}, b"abc")
    with pytest.raises(UserError, match=r"w\.safetensors: the header lists no tensor but 3 "
                                        r"bytes follow it \(corrupt"):
        open_tensors(path)


@pytest.mark.parametrize("header, data, shapes", [
    ({"__metadata__": None, "w": entry("BF16", [1, 2], 0, 4)}, bytes(4), {"w": (1, 2)}),
    ({"__metadata__": {}, "w": entry("F32", [1, 2], 0, 8)}, bytes(8), {"w": (1, 2)}),
    ({"w": {**entry("F32", [1, 2], 0, 8), "extra": 1}}, bytes(8), {"w": (1, 2)}),
    ({"w": entry("BF16", [], 0, 2)}, bytes(2), {"w": ()}),
    ({"z": entry("BF16", [0, 32], 4, 4), "w": entry("BF16", [2], 0, 4),
      "y": entry("F32", [0], 4, 4)}, bytes(4), {"w": (2,), "z": (0, 32), "y": (0,)}),
    ({}, b"", {}),
])
def test_valid_edge_files_still_load(tmp_path, header, data, shapes):
    """What the library accepts (null or empty metadata, unknown entry fields, scalars,
    zero-size tensors sharing an offset) still loads, in file order."""
    path = write_st(tmp_path / "w.safetensors", header, data)
    got = load_tensors(path)
    assert {k: v.shape for k, v in got.items()} == shapes
    assert list(got) == sorted(shapes, key=lambda k: (header[k]["data_offsets"][0],
                                                      list(header).index(k)))


def test_mixed_bf16_f32_file_loads_exactly(tmp_path):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((4, 32)).astype(np.float32)
    b = rng.standard_normal((3, 64)).astype(np.float32)
    bits = (a.view("<u4") >> 16).astype("<u2")
    path = write_st(tmp_path / "w.safetensors",
                    {"__metadata__": {"format": "pt"}, "a": entry("BF16", [4, 32], 0, 256),
                     "b": entry("F32", [3, 64], 256, 256 + 768)},
                    bits.tobytes() + b.tobytes())
    got = load_tensors(path)
    np.testing.assert_array_equal(got["a"], decode_bf16(bits.tobytes()).reshape(4, 32))
    np.testing.assert_array_equal(got["b"], b)
    assert list(got) == ["a", "b"]


def test_library_written_file_passes_the_check(tmp_path):
    tensors = {"x": np.arange(12, dtype=np.float32).reshape(3, 4), "y": np.zeros(0, np.int64),
               "z": np.full((2, 2), 7, np.int8)}
    path = tmp_path / "w.safetensors"
    save_file(tensors, str(path), metadata={"format": "np"})
    got = load_tensors(path)
    for name, array in tensors.items():
        assert got[name].dtype == array.dtype
        np.testing.assert_array_equal(got[name], array)


def test_a_shape_of_a_million_huge_dimensions_is_refused_without_the_whole_product(tmp_path):
    """The byte count of a long shape stops once it exceeds the tensor's bytes (an exact
    product of a million 20-digit numbers would take minutes): the message says "more than",
    not the product (no wall-clock limit here: a slow machine is no failure)."""
    dims = ",".join(["10000000000000000000"] * 1_000_000)
    path = write_st(tmp_path / "w.safetensors",
                    f'{{"w": {{"dtype": "BF16", "shape": [{dims}], '
                    f'"data_offsets": [0, 4]}}}}'.encode(), bytes(4))
    with pytest.raises(UserError, match=r"tensor 'w': data_offsets \[0, 4\] hold 4 bytes but "
                                        r"BF16 \[10+, 10+, .*\.\.\. needs more than 4: "
                                        r"corrupt header"):
        open_tensors(path)


@pytest.mark.parametrize("header, data, message", [
    ({"w": entry("BF16", [2, 32], 0, 128)}, ONES["BF16"] + b"GARBAGE!", "8 bytes follow it"),
    (b'{"w": {"dtype": "BF16", "shape": [Infinity, 32], "data_offsets": [0, 128]}}',
     ONES["BF16"], "header is not valid JSON: Infinity"),
    (b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", b"", "nested too deeply"),
], ids=["trailing bytes", "Infinity", "deep nesting"])
def test_quant_command_exits_2_with_the_message(tmp_path, capsys, monkeypatch, header, data,
                                                message):
    """``elmoe3d quant FILE`` reported on these BF16 files (exit 0) or died with a traceback
    (exit 1)."""
    monkeypatch.setattr(cli, "COMMANDS", {"quant": cli.COMMANDS["quant"]})
    path = write_st(tmp_path / "w.safetensors", header, data)
    rc = cli.main(["quant", str(path)])
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    assert f"{path.name}: " in err and message in err
    assert "Traceback" not in err
