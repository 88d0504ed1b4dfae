"""all-MiniLM-L6-v2 model folders with a bad config or bad weights (an audit): one-line
UserErrors naming the file and the field or tensor, never silent wrong embeddings.

Each case is a copy of the real model folder (the large files linked, the edited file
written) in ``tmp_path``.
"""

import json
import os
import shutil

import numpy as np
import pytest

from elmoe3d.errors import UserError

pytestmark = pytest.mark.minilm

TEXTS = ["This is an example sentence", "A man is playing a guitar.", "",
         "The stock market fell sharply today."]
W_UP0 = "encoder.layer.0.intermediate.dense.weight"
W_Q0 = "encoder.layer.0.attention.self.query.weight"


@pytest.fixture(scope="module")
def real_dir(minilm_file):
    return minilm_file.parent


@pytest.fixture(scope="module")
def real_config(real_dir):
    return json.loads((real_dir / "config.json").read_text())


@pytest.fixture(scope="module")
def real_tensors(minilm_file):
    from safetensors.numpy import load_file
    return load_file(str(minilm_file))


def _link_or_copy(src, dst):
    try:
        os.symlink(src, dst)
    except OSError:
        shutil.copy(src, dst)


def make_dir(tmp_path, real_dir, *, config=None, st_config=None, tensors=None):
    """A model folder: the real files, but ``config.json`` / ``sentence_bert_config.json``
    (bytes or a JSON-able object) and ``model.safetensors`` (a dict) replaced where given."""
    folder = tmp_path / "model"
    folder.mkdir()
    for name, given in (("config.json", config), ("sentence_bert_config.json", st_config)):
        if given is None:
            _link_or_copy(real_dir / name, folder / name)
        else:
            data = given if isinstance(given, bytes) else json.dumps(given).encode()
            (folder / name).write_bytes(data)
    _link_or_copy(real_dir / "tokenizer.json", folder / "tokenizer.json")
    if tensors is None:
        _link_or_copy(real_dir / "model.safetensors", folder / "model.safetensors")
    else:
        from safetensors.numpy import save_file
        save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()},
                  str(folder / "model.safetensors"))
    return folder


def edited(cfg, **changes):
    out = dict(cfg)
    for key, value in changes.items():
        if value is Ellipsis:
            del out[key]
        else:
            out[key] = value
    return out


# -- config.json -----------------------------------------------------------------------------

CONFIG_CASES = [
    # (id, config.json edit, message after "<folder>/config.json: ")
    ("layers-negative", dict(num_hidden_layers=-1),
     "num_hidden_layers: expected a positive integer up to 16,777,216, got -1"),
    ("layers-zero", dict(num_hidden_layers=0),
     "num_hidden_layers: expected a positive integer up to 16,777,216, got 0"),
    ("layers-bool", dict(num_hidden_layers=True),
     "num_hidden_layers: expected a positive integer up to 16,777,216, got true"),
    ("layers-float", dict(num_hidden_layers=2.7),
     "num_hidden_layers: expected a positive integer up to 16,777,216, got 2.7"),
    ("layers-huge", dict(num_hidden_layers=10 ** 30),
     f"num_hidden_layers: expected a positive integer up to 16,777,216, got {10 ** 30}"),
    ("eps-negative", dict(layer_norm_eps=-1.0),
     "layer_norm_eps: expected a finite number > 0, got -1.0"),
    ("eps-zero", dict(layer_norm_eps=0),
     "layer_norm_eps: expected a finite number > 0, got 0"),
    ("eps-null", dict(layer_norm_eps=None),
     "layer_norm_eps: expected a finite number > 0, got null"),
    ("eps-string", dict(layer_norm_eps="1e-12"),
     "layer_norm_eps: expected a finite number > 0, got \"1e-12\""),
    ("eps-bool", dict(layer_norm_eps=True),
     "layer_norm_eps: expected a finite number > 0, got true"),
    ("eps-nan", dict(layer_norm_eps=float("nan")),
     "layer_norm_eps: expected a finite number > 0, got NaN"),
    ("eps-inf", dict(layer_norm_eps=float("inf")),
     "layer_norm_eps: expected a finite number > 0, got Infinity"),
    ("eps-huge-int", dict(layer_norm_eps=10 ** 400),
     "layer_norm_eps: expected a finite number > 0, got 1000"),
    ("hidden-missing", dict(hidden_size=...),
     "hidden_size: missing (a bert config has it)"),
    ("eps-missing", dict(layer_norm_eps=...),
     "layer_norm_eps: missing (a bert config has it)"),
    ("hidden-garbled", dict(hidden_size="384x"),
     "hidden_size: expected a positive integer up to 16,777,216, got \"384x\""),
    ("hidden-string", dict(hidden_size="384"),
     "hidden_size: expected a positive integer up to 16,777,216, got \"384\""),
    ("heads-zero", dict(num_attention_heads=0),
     "num_attention_heads: expected a positive integer up to 16,777,216, got 0"),
    ("heads-not-dividing", dict(num_attention_heads=7),
     "hidden_size 384 is not a multiple of num_attention_heads 7"),
    ("ffn-list", dict(intermediate_size=[1536]),
     "intermediate_size: expected a positive integer up to 16,777,216, got [1536]"),
    ("positions-zero", dict(max_position_embeddings=0),
     "max_position_embeddings: expected a positive integer up to 16,777,216, got 0"),
    ("positions-one", dict(max_position_embeddings=1),   # no room for [CLS] and [SEP]
     "max_position_embeddings: expected an integer >= 2, got 1"),
    ("model-type", dict(model_type="gpt2"),
     "model_type = 'gpt2'; this forward pass implements only 'bert'"),
]


@pytest.mark.parametrize("change, message", [c[1:] for c in CONFIG_CASES],
                         ids=[c[0] for c in CONFIG_CASES])
def test_bad_config_field(tmp_path, real_dir, real_config, change, message):
    from elmoe3d.sw.host.minilm import MiniLM
    folder = make_dir(tmp_path, real_dir, config=edited(real_config, **change))
    with pytest.raises(UserError) as info:
        MiniLM(folder)
    text = str(info.value)
    assert text.startswith(f"{folder / 'config.json'}: {message}"), text
    assert "\n" not in text


@pytest.mark.parametrize("data, message", [
    (b"\xff{}", "not a config.json (not UTF-8 text)"),
    (b"[1]", "expected a JSON object of config fields, got list"),
    (b"{", "not JSON (line 1"),
    (b"", "not JSON (line 1"),
], ids=["not-utf8", "json-list", "truncated", "empty"])
def test_unreadable_config(tmp_path, real_dir, data, message):
    from elmoe3d.sw.host.minilm import BertConfig, MiniLM
    folder = make_dir(tmp_path, real_dir, config=data)
    for load in (MiniLM, lambda f: BertConfig.from_file(f / "config.json")):
        with pytest.raises(UserError, match="^" + str(folder / "config.json").replace(
                "\\", "\\\\") + ": ") as info:
            load(folder)
        assert message in str(info.value)


def test_config_fields_read_without_conversion(tmp_path, real_dir, real_config):
    from elmoe3d.sw.host.minilm import BertConfig
    folder = make_dir(tmp_path, real_dir, config=edited(real_config, layer_norm_eps=1))
    cfg = BertConfig.from_file(folder / "config.json")
    assert cfg == BertConfig(hidden_size=384, num_heads=12, num_layers=6,
                             intermediate_size=1536, layer_norm_eps=1.0, max_positions=512)
    assert type(cfg.layer_norm_eps) is float and type(cfg.num_layers) is int


# -- config.json against model.safetensors ----------------------------------------------------

@pytest.mark.parametrize("change, message", [
    # A 1024-row position table was promised, the file has 512 rows: a 700-token text was a
    # broadcast error in the embedding sum.
    (dict(max_position_embeddings=1024),
     "tensor 'embeddings.position_embeddings.weight': shape [512, 384], expected [1024, 384] "
     "(max_position_embeddings, hidden_size of "),
    (dict(hidden_size=768), "tensor 'embeddings.LayerNorm.bias': shape [384], expected [768] "
                            "(hidden_size of "),
    (dict(intermediate_size=3072),                  # (the first in file order: the bias)
     "tensor 'encoder.layer.0.intermediate.dense.bias': shape [1536], expected [3072] "
     "(intermediate_size of "),
    (dict(num_hidden_layers=12),
     "tensor 'encoder.layer.6.attention.self.query.weight' is missing; the encoder of "),
    (dict(num_hidden_layers=2),
     "tensor 'encoder.layer.2.attention.output.LayerNorm.bias' is not part of the BERT "
     "encoder "),
], ids=["positions-1024", "hidden-768", "ffn-3072", "layers-12", "layers-2"])
def test_config_conflicts_with_the_weights(tmp_path, real_dir, real_config, change, message):
    from elmoe3d.sw.host.minilm import MiniLM
    folder = make_dir(tmp_path, real_dir, config=edited(real_config, **change))
    with pytest.raises(UserError) as info:
        MiniLM(folder)
    assert str(info.value).startswith(f"{folder / 'model.safetensors'}: {message}"), \
        str(info.value)


# -- sentence_bert_config.json ----------------------------------------------------------------

@pytest.mark.parametrize("data, message", [
    (b"{", "not JSON (line 1"),

    (b"[]", "expected a JSON object of config fields, got list"),
    (b'{"max_seq_length": -5}',
     "max_seq_length: expected a positive integer up to 16,777,216, got -5"),
    (b'{"max_seq_length": 0}',
     "max_seq_length: expected a positive integer up to 16,777,216, got 0"),
    (b'{"max_seq_length": "abc"}',
     "max_seq_length: expected a positive integer up to 16,777,216, got \"abc\""),
    (b'{"max_seq_length": 128.5}',
     "max_seq_length: expected a positive integer up to 16,777,216, got 128.5"),
    (b'{"max_seq_length": true}',
     "max_seq_length: expected a positive integer up to 16,777,216, got true"),
    (b'{"max_seq_length": 1}', "max_seq_length: expected an integer >= 2, got 1"),
], ids=["truncated", "list", "negative", "zero", "string", "float", "bool", "one"])
def test_bad_sentence_bert_config(tmp_path, real_dir, data, message):
    from elmoe3d.sw.host.minilm import MiniLM
    folder = make_dir(tmp_path, real_dir, st_config=data)
    with pytest.raises(UserError) as info:
        MiniLM(folder)
    assert str(info.value).startswith(f"{folder / 'sentence_bert_config.json'}: {message}"), \
        str(info.value)


@pytest.mark.parametrize("st_config", [{}, {"max_seq_length": None}, {"max_seq_length": 384.0}])
def test_a_sentence_bert_config_without_a_length_takes_the_models(tmp_path, real_dir,
                                                                  st_config):
    """A review (2026-12-06): absent or null, max_seq_length is the model's limit (as
    sentence-transformers reads it), and 384.0 is 384 (the config readers' one integer
    rule, hf_config.ConfigFields)."""
    from elmoe3d.sw.host.minilm import MiniLM
    model = MiniLM(make_dir(tmp_path, real_dir, st_config=st_config))
    assert model.max_seq_length == (384 if st_config.get("max_seq_length") else 512)


def test_an_integral_float_in_config_json_is_read_as_its_integer(tmp_path, real_dir,
                                                                 real_config):
    """``"num_hidden_layers": 6.0`` loads as 6, as the model-config reader takes it (a
    review: the first form of these checks refused it)."""
    from elmoe3d.sw.host.minilm import MiniLM
    folder = make_dir(tmp_path, real_dir, config=edited(real_config, num_hidden_layers=6.0,
                                                        hidden_size=384.0))
    assert MiniLM(folder).config.num_layers == 6


def test_long_max_seq_length_is_bounded_by_the_position_table(tmp_path, real_dir):
    from elmoe3d.sw.host.minilm import MiniLM
    folder = make_dir(tmp_path, real_dir, st_config={"max_seq_length": 10 ** 6})
    model = MiniLM(folder)
    assert model.max_seq_length == 512
    ids, _, _ = model.tokenize(["word " * 700])
    assert ids.shape == (1, 512)
    ffn_in, _ = model.ffn_activations(["word " * 700], 0)
    assert ffn_in.shape == (512, 384) and np.isfinite(ffn_in).all()


# -- model.safetensors ------------------------------------------------------------------------

def _set(name, index, value):
    def edit(t):
        a = t[name].copy()
        a[index] = value
        t[name] = a
    return edit


def _replace(name, make):
    def edit(t):
        t[name] = make(t[name])
    return edit


def _drop(name):
    return lambda t: t.pop(name)


WEIGHT_CASES = [
    ("nan", _set(W_UP0, (0, 0), np.nan),
     f"tensor '{W_UP0}': non-finite value nan at [0, 0]; expected finite weights"),
    ("inf-bias", _set("encoder.layer.5.output.dense.bias", 7, -np.inf),
     "tensor 'encoder.layer.5.output.dense.bias': non-finite value -inf at [7]"),
    ("nan-word-embedding", _set("embeddings.word_embeddings.weight", (2023, 5), np.nan),
     "tensor 'embeddings.word_embeddings.weight': non-finite value nan at [2023, 5]"),
    ("int8", _replace(W_Q0, lambda a: (a * 100).astype(np.int8)),
     f"tensor '{W_Q0}': dtype I8; expected a floating-point tensor (F16, BF16, F32 or F64)"),
    ("transposed", _replace(W_UP0, lambda a: a.T),
     f"tensor '{W_UP0}': shape [384, 1536], expected [1536, 384] (intermediate_size, "
     f"hidden_size of "),
    ("one-d", _replace(W_Q0, lambda a: a[0]),
     f"tensor '{W_Q0}': shape [384], expected [384, 384] (hidden_size, hidden_size of "),
    ("bias-2d", _replace("embeddings.LayerNorm.bias", lambda a: a[None]),
     "tensor 'embeddings.LayerNorm.bias': shape [1, 384], expected [384] (hidden_size of "),
    ("no-token-types", _replace("embeddings.token_type_embeddings.weight", lambda a: a[:0]),
     "tensor 'embeddings.token_type_embeddings.weight': shape [0, 384], expected [N, 384] "
     "(N >= 1, hidden_size of "),
    ("missing", _drop("encoder.layer.3.output.dense.bias"),
     "tensor 'encoder.layer.3.output.dense.bias' is missing; the encoder of "),
    ("extra", lambda t: t.__setitem__("encoder.layer.0.attention.self.distance_embedding"
                                      ".weight", np.zeros((3, 32), np.float32)),
     "tensor 'encoder.layer.0.attention.self.distance_embedding.weight' is not part of the "
     "BERT encoder "),
    ("short-vocabulary", _replace("embeddings.word_embeddings.weight", lambda a: a[:1000]),
     "tensor 'embeddings.word_embeddings.weight' has 1000 rows, but "),
]


@pytest.mark.parametrize("edit, message", [c[1:] for c in WEIGHT_CASES],
                         ids=[c[0] for c in WEIGHT_CASES])
def test_bad_weights(tmp_path, real_dir, real_tensors, edit, message):
    from elmoe3d.sw.host.minilm import MiniLM
    tensors = dict(real_tensors)
    edit(tensors)
    folder = make_dir(tmp_path, real_dir, tensors=tensors)
    with pytest.raises(UserError) as info:
        MiniLM(folder)
    text = str(info.value)
    assert text.startswith(f"{folder / 'model.safetensors'}: {message}"), text
    assert "\n" not in text


def test_ffn_weights_checks_its_tensors(tmp_path, real_dir, real_tensors, monkeypatch):
    import elmoe3d.sw.host.minilm as minilm
    tensors = dict(real_tensors)
    _set("encoder.layer.2.output.dense.weight", (3, 4), np.nan)(tensors)
    folder = make_dir(tmp_path, real_dir, tensors=tensors)
    monkeypatch.setattr(minilm, "require_minilm_dir", lambda: folder)
    with pytest.raises(UserError, match=r"model\.safetensors: tensor 'encoder\.layer\.2\.output"
                                        r"\.dense\.weight': non-finite value nan at \[3, 4\]"):
        minilm.ffn_weights(2)
    up, down = minilm.ffn_weights(1)
    assert up.shape == (1536, 384) and down.shape == (384, 1536)


# -- parameters -------------------------------------------------------------------------------

@pytest.mark.parametrize("batch_size", [0, -1, True, 2.5, "8", None])
def test_bad_batch_size(real_dir, batch_size):
    from elmoe3d.sw.host.minilm import MiniLM
    with pytest.raises(ValueError, match=r"^batch_size: expected a positive integer, got "):
        MiniLM(real_dir, batch_size=batch_size)


def test_bad_model_dir():
    from elmoe3d.sw.host.minilm import MiniLM
    with pytest.raises(ValueError, match="^model_dir: expected the path of a folder, got int"):
        MiniLM(5)


# -- the real model is unchanged ------------------------------------------------------------

def test_copied_folder_gives_identical_embeddings(tmp_path, real_dir, real_config,
                                                  real_tensors):
    from elmoe3d.sw.host.minilm import MiniLM, load_minilm
    ref = load_minilm().sentence_embeddings(TEXTS)
    # The same config, rewritten, and the same tensors, rewritten: bit-identical results.
    folder = make_dir(tmp_path, real_dir, config=dict(real_config), tensors=dict(real_tensors))
    model = MiniLM(folder, batch_size=np.int64(8))
    assert model.batch_size == 8 and type(model.batch_size) is int
    assert np.array_equal(model.sentence_embeddings(TEXTS), ref)
    assert np.array_equal(model.ffn_activations(TEXTS, 1)[1],
                          load_minilm().ffn_activations(TEXTS, 1)[1])
    # Published sentence-transformers values (see test_minilm.py) still hold.
    np.testing.assert_allclose(ref[0, :3], [0.06765693, 0.06349593, 0.04871314], atol=1e-6)
