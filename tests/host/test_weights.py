"""Weight-file loader (elmoe3d.sw.host.weights): round trips, BF16, and the failure kinds."""

import json
import struct

import numpy as np
import pytest
from safetensors.numpy import save_file

from elmoe3d.errors import UserError
from elmoe3d.sw.host.weights import decode_bf16, load_tensors, open_tensors, select_names


def write_raw_safetensors(path, tensors):
    """tensors: list of (name, dtype string, shape, raw bytes). Writes the file by hand."""
    header, blobs, offset = {}, [], 0
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    return path


@pytest.fixture
def st_file(tmp_path):
    tensors = {
        "layer.0.up.weight": np.arange(64 * 3, dtype=np.float32).reshape(3, 64) / 7,
        "layer.0.up.bias": np.linspace(-1, 1, 3).astype(np.float64),
        "layer.0.down.weight": np.full((2, 32), 0.5, np.float16),
        "position_ids": np.arange(5, dtype=np.int64)[None],
    }
    path = tmp_path / "w.safetensors"
    save_file(tensors, str(path))
    return path, tensors


def test_safetensors_round_trip(st_file):
    path, tensors = st_file
    got = load_tensors(path)
    assert set(got) == set(tensors)
    for name, array in tensors.items():
        assert got[name].dtype == array.dtype, name          # F16/F32/F64/I64 as stored
        np.testing.assert_array_equal(got[name], array)
    assert got.non_float == ("position_ids",)
    assert got.info["layer.0.down.weight"].dtype == "F16"
    assert got.info["layer.0.up.weight"].shape == (3, 64) and got.info["layer.0.up.weight"].is_float


def test_pattern_selects_and_does_not_load_the_rest(st_file, monkeypatch):
    path, tensors = st_file
    tf = open_tensors(path)
    loaded = []
    real_load = type(tf).load
    monkeypatch.setattr(type(tf), "load", lambda self, n: loaded.append(n) or real_load(self, n))
    got = load_tensors(path, "*.weight, position_*")
    assert list(got) == [n for n in tf.names if n != "layer.0.up.bias"]
    assert sorted(loaded) == sorted(got)


def test_npz_round_trip(tmp_path):
    arrays = {"a.weight": np.ones((4, 32), np.float32), "b": np.arange(6, dtype=np.int32),
              "c.half": np.zeros((1, 32), np.float16)}
    path = tmp_path / "w.npz"
    np.savez_compressed(path, **arrays)
    got = load_tensors(path)
    assert list(got) == list(arrays)
    for name, array in arrays.items():
        assert got[name].dtype == array.dtype
        np.testing.assert_array_equal(got[name], array)
    assert got.non_float == ("b",)
    assert list(load_tensors(path, "c.*")) == ["c.half"]


# Known bfloat16 bit patterns and their exact values.
BF16_KNOWN = [
    (0x3F80, 1.0), (0xC000, -2.0), (0x4049, 3.140625), (0x3E80, 0.25),
    (0x0000, 0.0), (0x7F7F, 3.3895313892515355e38),        # largest finite bfloat16
    (0x0001, 2.0 ** -133),                                   # smallest subnormal
    (0x7F80, np.inf), (0xFF80, -np.inf),
]


def test_decode_bf16_known_values():
    bits = np.array([b for b, _ in BF16_KNOWN], np.uint16)
    got = decode_bf16(bits.tobytes())
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, np.array([v for _, v in BF16_KNOWN], np.float32))
    assert np.isnan(decode_bf16(np.array([0x7FC0], np.uint16)))[0]


def test_bf16_safetensors_decoded_not_garbage(tmp_path):
    bits = np.array([b for b, _ in BF16_KNOWN[:6]], "<u2").reshape(2, 3)
    path = write_raw_safetensors(tmp_path / "bf.safetensors", [
        ("w", "BF16", (2, 3), bits.tobytes()),
        ("x", "F32", (2,), np.array([1.5, -2.5], "<f4").tobytes()),
    ])
    got = load_tensors(path)
    assert got["w"].dtype == np.float32 and got["w"].shape == (2, 3)
    np.testing.assert_array_equal(got["w"].ravel(), [v for _, v in BF16_KNOWN[:6]])
    np.testing.assert_array_equal(got["x"], [1.5, -2.5])
    assert got.info["w"].dtype == "BF16" and got.info["w"].is_float


def test_missing_file(tmp_path):
    with pytest.raises(UserError, match=r"nope\.safetensors: no such file"):
        load_tensors(tmp_path / "nope.safetensors")


def test_git_lfs_pointer(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_text("version https://git-lfs.github.com/spec/v1\n"
                    "oid sha256:" + "ab" * 32 + "\nsize 90868376\n")
    with pytest.raises(UserError, match=r"model\.safetensors: is a Git LFS pointer file "
                                        r"to a 90868376-byte object"):
        open_tensors(path)
    npz = tmp_path / "w.npz"                       # any suffix
    npz.write_bytes(path.read_bytes())
    with pytest.raises(UserError, match="Git LFS pointer"):
        load_tensors(npz)


def test_truncated_data(st_file, tmp_path):
    path, _ = st_file
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(UserError, match=r"cut\.safetensors: tensor '.*': data ends at byte "
                                        r"\d+ but the file has only \d+ bytes: truncated"):
        open_tensors(cut)


def test_truncated_header(st_file, tmp_path):
    path, _ = st_file
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(path.read_bytes()[:40])
    with pytest.raises(UserError, match=r"cut\.safetensors: header length \d+ bytes runs past "
                                        r"the end of the file \(40 bytes\)"):
        open_tensors(cut)
    cut.write_bytes(b"\x01\x02")
    with pytest.raises(UserError, match="too short"):
        open_tensors(cut)


def test_corrupt_header(tmp_path):
    path = write_raw_safetensors(tmp_path / "bad.safetensors",
                                 [("w", "F32", (4, 4), bytes(32))])      # needs 64 bytes
    with pytest.raises(UserError, match=r"tensor 'w': data_offsets \[0, 32\] hold 32 bytes but "
                                        r"F32 \[4, 4\] needs 64"):
        open_tensors(path)
    path.write_bytes(struct.pack("<Q", 8) + b"{not js}")
    with pytest.raises(UserError, match="not valid JSON"):
        open_tensors(path)


def test_corrupt_npz(tmp_path):
    path = tmp_path / "w.npz"
    np.savez(path, a=np.ones((64, 64), np.float32))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match=r"w\.npz: corrupt or truncated"):
        load_tensors(path)
    path.write_bytes(b"\x93NUMPY not a zip")
    with pytest.raises(UserError, match="not a zip archive"):
        load_tensors(path)


def test_pattern_matching_nothing_lists_names(st_file):
    path, _ = st_file
    with pytest.raises(UserError, match=r"no tensor matches 'layer\.0\.upp\.weight' "
                                        r"\(did you mean layer\.0\.up\.weight"):
        load_tensors(path, "layer.0.upp.weight")
    with pytest.raises(UserError, match=r"no tensor matches 'zzz\*' \(available: "
                                        r"position_ids, "):
        load_tensors(path, "*.weight,zzz*")      # one bad glob among several is an error
    with pytest.raises(UserError, match=r"no tensor named 'nothere' \(available: "):
        open_tensors(path).load("nothere")
    # a name with glob characters is a name (a review found it crashed when the glob matched)
    with pytest.raises(UserError, match=r"no tensor named '\*\.weight' \(did you mean "):
        open_tensors(path).load("*.weight")


def test_an_npz_header_larger_than_its_data_is_refused_before_loading(tmp_path):
    """A review's finding (2026-12-07): an .npz member whose header declares a shape far
    larger than its data (corrupt or crafted) made NumPy allocate the declared array (149 GiB
    here) and fail with a traceback. Now its header is checked against the member's size
    when the file is opened, naming the tensor; as a routing trace the same."""
    import io
    import zipfile
    from elmoe3d.sw.host.trace import TraceError, RoutingTrace

    def member(shape):
        b = io.BytesIO()
        np.lib.format.write_array_header_1_0(b, {"descr": "<f4", "fortran_order": False,
                                                 "shape": shape})
        return b.getvalue() + b"\0" * 128
    huge = tmp_path / "huge.npz"
    with zipfile.ZipFile(huge, "w") as z:
        z.writestr("w.npy", member((200000, 200000)))
        z.writestr("ok.npy", member((32,)))
    with pytest.raises(UserError, match=r"huge\.npz: tensor 'w': corrupt \.npy member \(its "
                       r"header declares shape \(200000, 200000\) of float32 "
                       r"\(160,000,000,000 B of data\) but the member holds at most 128 B "
                       r"after it\)"):
        open_tensors(huge)
    with zipfile.ZipFile(huge, "w") as z:
        z.writestr("ok.npy", member((32,)))
    assert open_tensors(huge).load("ok").shape == (32,)
    # the same header with the archive's own size of the member forged to fit it (a review's
    # trial): the archive's bytes bound what a stored member holds
    for kind in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        with zipfile.ZipFile(huge, "w", kind) as z:
            z.writestr("w.npy", member((200000, 200000)))
            z.filelist[0].file_size = 200000 * 200000 * 4 + 128
        with pytest.raises(UserError, match=r"huge\.npz: tensor 'w': corrupt \.npy member \(its "
                           r"header declares shape \(200000, 200000\) of float32 "):
            open_tensors(huge)
    with zipfile.ZipFile(huge, "w") as z:
        z.writestr("request.npy", member((10 ** 11,)))
    with pytest.raises(TraceError, match=r"huge\.npz: not a readable \.npz trace: array "
                       r"'request': its header declares shape \(100000000000,\)"):
        RoutingTrace.load(huge)


def test_unsupported_format_and_dtype(tmp_path):
    path = tmp_path / "pytorch_model.bin"
    path.write_bytes(b"\x80\x02junk")
    with pytest.raises(UserError, match=r"unsupported format '\.bin'.*convert them"):
        load_tensors(path)
    st = write_raw_safetensors(tmp_path / "f8.safetensors",
                               [("w", "F8_E4M3", (2, 2), bytes(4))])
    tf = open_tensors(st)
    assert not tf.infos["w"].loadable and not tf.infos["w"].is_float
    with pytest.raises(UserError, match=r"f8\.safetensors: tensor 'w': dtype F8_E4M3 is not "
                                        r"supported"):
        tf.load("w")


def test_directory_and_empty(tmp_path, st_file):
    with pytest.raises(UserError, match=r"is a directory: give one of its weight files "
                                        r"\(w\.safetensors\)"):
        open_tensors(tmp_path)
    empty = tmp_path / "e.safetensors"
    empty.write_bytes(b"")
    with pytest.raises(UserError, match="is empty"):
        open_tensors(empty)


def test_select_names_order_and_comma():
    names = ["b.weight", "a.bias", "a.weight"]
    assert select_names(names, None) == names
    assert select_names(names, "a.*, b.weight") == names[0:3]
    assert select_names(names, ["*.bias"]) == ["a.bias"]
