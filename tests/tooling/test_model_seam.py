"""The model seam (``diloco.core.model_seam``): ``config.model`` picks the MLP or the transformer.

What the composition test (``test_core.py``, every feature x algorithm x executor x model)
and the oracle (``test_oracles.py``) do not show: the config refuses what the other model
would ignore, Muon acts on the transformer's hidden matrices only, Streaming's fragments
are its blocks (a hand-worked table), and the command line runs it as the README shows.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_helpers import only_run_dir, run_cli
from test_text import unigram_oracle

from diloco import DiLoCoConfig
from diloco.config import TransformerShape
from diloco.config.sections import FamilyConfig
from diloco.core.model_seam import data_model, parameter_keys
from diloco.core.run_records import prepare_training
from diloco.core.synchronisers import FragmentSync
from diloco.models.mlp import MLPModel
from diloco.text import OneHot, char_windows, load_shakespeare

TINY = TransformerShape(d_model=8, n_heads=2, n_layers=2)


def _chars(context=4):
    ids = np.random.default_rng(0).integers(0, 7, 200)
    x, y = char_windows(ids, context)
    return x, y


def test_the_config_names_the_model_and_refuses_the_other_models_settings():
    with pytest.raises(ValueError, match=r"DiLoCoConfig\.model must be one of \('mlp', 'transformer'\)"):
        DiLoCoConfig(model="cnn")
    with pytest.raises(ValueError, match="transformer settings need model='transformer'"):
        DiLoCoConfig(transformer=TINY)
    with pytest.raises(ValueError, match="hidden_sizes configure the MLP"):
        DiLoCoConfig(model="transformer", hidden_sizes=(64,))
    with pytest.raises(ValueError, match=r"TransformerShape\.n_heads must divide d_model \(10\), got 4"):
        TransformerShape(d_model=10)
    config = DiLoCoConfig(model="transformer", transformer=TINY)
    assert DiLoCoConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_the_transformer_needs_character_windows():
    x = np.random.default_rng(0).standard_normal((20, 4))
    config = DiLoCoConfig(model="transformer")
    with pytest.raises(ValueError, match="trains on character windows"):
        data_model(config, x, None)
    with pytest.raises(ValueError, match="trains on character windows"):
        data_model(config, x, OneHot(7, 3))  # windows of 4, an encoder of 3
    mlp = data_model(DiLoCoConfig(hidden_sizes=(8,)), x, None, 3)  # the MLP: its widths from the data
    assert isinstance(mlp, MLPModel) and mlp.widths == (4, 8, 3)
    assert data_model(DiLoCoConfig(hidden_sizes=(8,)), x, OneHot(7, 4), 7).widths == (28, 8, 7)  # one-hot columns
    with pytest.raises(TypeError, match="needs num_classes"):
        data_model(DiLoCoConfig(), x, None)


def test_muon_acts_on_the_transformers_hidden_matrices_only():
    x, y = _chars()
    config = DiLoCoConfig(num_workers=2, model="transformer", transformer=TINY, inner_optimizer="muon")
    fixed, _, _, params = prepare_training(x, y, config, encode=OneHot(7, 4))
    assert fixed.muon.keys == ("h0.attn.qkv", "h0.attn.proj", "h0.mlp.fc", "h0.mlp.proj",
                               "h1.attn.qkv", "h1.attn.proj", "h1.mlp.fc", "h1.mlp.proj")
    assert list(params) == parameter_keys(config)
    named = config.replace(muon={"keys": ("h0.mlp.fc",)})  # the user's choice is kept
    assert prepare_training(x, y, named, encode=OneHot(7, 4))[0].muon.keys == ("h0.mlp.fc",)


@pytest.mark.parametrize("fragments, pattern, want", [
    # 4 blocks: E = (wte, wpe), h0, h1, F = (ln_f[, head]); strided P = 2 takes blocks 1, 3 and 2, 4.
    (2, "strided", [("E", "h1"), ("h0", "F")]),
    (2, "sequential", [("E", "h0"), ("h1", "F")]),
    (3, "strided", [("E", "F"), ("h0",), ("h1",)]),
    (4, "sequential", [("E",), ("h0",), ("h1",), ("F",)]),
])
def test_streaming_fragments_are_the_transformers_blocks(fragments, pattern, want):
    x, y = _chars()
    config = DiLoCoConfig(num_workers=2, inner_steps=4, model="transformer", transformer=TINY,
                          family=FamilyConfig(fragments=fragments, pattern=pattern))
    _, _, _, params = prepare_training(x, y, config, encode=OneHot(7, 4))
    blocks = {"E": ["wte", "wpe"], "F": ["ln_f.gain", "ln_f.bias"],
              "h0": [k for k in params if k.startswith("h0.")], "h1": [k for k in params if k.startswith("h1.")]}
    got = FragmentSync(config, params, None).keys
    assert [sorted(keys) for keys in got] == [sorted(k for name in names for k in blocks[name]) for names in want]


def test_more_fragments_than_blocks_is_refused_in_the_models_words():
    with pytest.raises(ValueError, match=r"must not exceed the model's layers \(4, from n_layers 2 \+ 2\)"):
        DiLoCoConfig(inner_steps=8, model="transformer", transformer=TINY,
                     family=FamilyConfig(fragments=5)).family.check_against(
            DiLoCoConfig(inner_steps=8, model="transformer", transformer=TINY, family=FamilyConfig(fragments=5)))


def test_the_command_line_refuses_transformer_flags_without_it_and_other_data(capsys, tmp_path):
    status, _, err = run_cli(["train", "--d-model", "32", "--runs-dir", tmp_path], capsys)
    assert status == 2 and "--d-model configure(s) the transformer: add --model transformer" in err
    status, _, err = run_cli(["train", "--model", "transformer", "--runs-dir", tmp_path], capsys)
    assert status == 2 and "transformer" in err and "--data shakespeare" in err, err
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_compare_runs_the_transformer_in_float32_on_64_characters(capsys, tmp_path):
    status, out, err = run_cli(["compare", "--model", "transformer", "--data", "shakespeare", "--d-model", "16",
                                "--n-heads", "2", "--n-layers", "1", "-K", "2", "-H", "2", "--rounds", "1",
                                "--batch-size", "2", "--eval-windows", "16", "-q", "--no-plots",
                                "--runs-dir", tmp_path], capsys)
    assert status == 0, err
    written = json.loads((only_run_dir(tmp_path) / "config.json").read_text())
    config = written["config"]
    assert config["model"] == "transformer" and config["dtype"] == "float32"
    assert config["transformer"] == {"d_model": 16, "n_heads": 2, "n_layers": 1, "mlp_ratio": 4, "tied": True}
    assert written["data"]["context"] == 64
    line = next(line for line in out.splitlines() if line.startswith("n-gram baselines on the same held-out text"))
    unigram = float(line.split("unigram ")[1].split(",")[0])  # scored on every position of a window, as the model
    assert unigram == pytest.approx(unigram_oracle(load_shakespeare(64, eval_windows=16).dataset, last=False), abs=1e-4)


def test_titles_and_messages_name_the_transformers_flags():
    from diloco.tools.cli.flag_names import config_differences, in_flag_words

    config = DiLoCoConfig(model="transformer", transformer=TransformerShape(d_model=32, tied=False))
    assert config_differences(config) == ["--model transformer", "--d-model 32", "--no-tied"]
    with pytest.raises(ValueError) as caught:
        TransformerShape(d_model=10)
    assert in_flag_words(str(caught.value)) == "--n-heads must divide d_model (10), got 4"


def test_position_losses_average_to_the_held_out_loss_and_each_reads_only_its_prefix():
    """Position t's loss is the loss of the window's first t + 1 characters' last prediction (the model is
    causal), computed here window by window on the truncated windows; their mean is ``metrics``' loss."""
    from diloco.models import TransformerConfig, TransformerModel
    from diloco.models.transformer import init_transformer_params, transformer_forward

    cfg = TransformerConfig(vocab_size=7, context=6, d_model=8, n_heads=2, n_layers=1, dtype="float64")
    rng = np.random.default_rng(3)
    params = init_transformer_params(rng, cfg)
    x, y = rng.integers(0, 7, (5, 6)).astype(np.float32), rng.integers(0, 7, 5)
    model = TransformerModel(cfg, eval_chunk=2)
    got = model.position_losses(params, x, y)
    targets = np.concatenate([x[:, 1:], y[:, None]], axis=1).astype(int)
    want = np.zeros(6)
    for row in range(5):
        for t in range(6):
            logits, _ = transformer_forward(params, x[row:row + 1, :t + 1].astype(int), cfg)
            last = logits[0, -1]
            want[t] += (np.log(np.exp(last - last.max()).sum()) + last.max() - last[targets[row, t]]) / 5
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert got.mean() == pytest.approx(model.metrics(params, x, y)[0], rel=1e-12)


def test_every_model_the_config_accepts_has_a_kind():
    """Code outside the model classes asks ``model_kind(config)`` what a model does, never its name."""
    from diloco.config.sections import MODELS
    from diloco.core.model_seam import MODEL_KINDS, model_kind

    assert set(MODEL_KINDS) == set(MODELS)
    mine = {name: model_kind(DiLoCoConfig(model=name)).sequence_model for name in MODELS}
    assert mine == {"mlp": False, "transformer": True}, f"sequence models: mine {mine}"
