"""Configs: every Table 3 row, overrides with typo hints, the params command against the paper."""

import os

import pytest
from helpers import REPO

from tfm_jax.cli.main import main
from tfm_jax.config.build import build_config, load_config_module
from tfm_jax.config.defaults import config_from_json
from tfm_jax.config.validate import ConfigError

TABLE3 = load_config_module(os.path.join(REPO, "configs", "table3.py"))


def test_rows_set_what_the_paper_says():
    b16 = TABLE3.row_config("B16")
    assert (b16.model.d_k, b16.model.d_v, b16.model.num_heads) == (16, 64, 8)
    c256 = TABLE3.row_config("C256")
    assert (c256.model.d_model, c256.model.d_k, c256.optim.d_model) == (256, 32, 256)
    big = build_config("configs/big.py", {})
    assert (big.model.d_model, big.model.d_ff, big.model.num_heads, big.model.dropout) == (
        1024, 4096, 16, 0.3,
    )  # fmt: skip
    enfr = build_config("configs/big_enfr.py", {})
    assert enfr.model.dropout == 0.1 and enfr.data.tfds_name == "wmt14_translate/fr-en"
    assert enfr.model.vocab_size == enfr.data.vocab_size == 32000
    e = build_config("configs/table3.py:E", {})
    assert e.model.positional == "learned"


def test_overrides_are_typed_and_follow_references():
    cfg = build_config(
        "configs/small.py",
        {"model.d_model": "128", "model.dropout": "0.3", "data.packing": "false",
         "train.seed": "7", "model.positional": "learned"},
    )  # fmt: skip
    assert cfg.model.d_model == 128 and cfg.optim.d_model == 128  # the schedule follows
    assert cfg.model.dropout == 0.3 and cfg.data.packing is False
    assert cfg.train.seed == 7 and cfg.model.positional == "learned"


@pytest.mark.parametrize(
    "override, hint",
    [
        ("--config.model.num_head=1", 'Did you mean "model.num_heads"'),
        ("--config.modle.num_heads=1", 'Did you mean "model"'),
        ("--config.optim.warmup=10", 'Did you mean "optim.warmup_steps"'),
        ("--config.model.num_heads=x", "expected a int"),
        ("--config.model.positional=learnt", "model.positional"),
    ],
)
def test_bad_overrides_are_clear_errors(override, hint, capsys):
    rc = main(["params", "--config=configs/small.py", override])
    err = capsys.readouterr().err
    assert rc == 2 and hint in err and "Traceback" not in err


def test_unknown_row_and_missing_file():
    with pytest.raises(ConfigError, match='Did you mean "C256"'):
        TABLE3.row_config("C265")
    with pytest.raises(ConfigError, match="does not exist"):
        build_config("configs/nope.py", {})


def test_saved_config_round_trip_keeps_types():
    cfg = build_config("configs/small.py", {"model.num_heads": "2"})
    back = config_from_json(cfg.to_json())
    assert back.model.num_heads == 2 and back.mesh.rules == cfg.mesh.rules
    assert back.data.get_type("tfds_data_dir") is str  # placeholders stay typed


def test_relocated_finds_a_moved_workdirs_own_files(tmp_path):
    from tfm_jax.config.paths import relocated

    new = tmp_path / "new"
    (new / "vocab").mkdir(parents=True)
    (new / "vocab" / "spm.model").write_text("x")
    old = "/gone/run"
    assert relocated("/gone/run/vocab/spm.model", old, str(new)) == str(new / "vocab" / "spm.model")
    assert relocated("/gone/run/vocab/other.model", old, str(new)) is None  # not there either
    assert relocated("/elsewhere/spm.model", old, str(new)) is None  # not under the old workdir
    assert relocated("/gone/run/vocab/spm.model", None, str(new)) is None  # no record of it
    assert relocated("gs://b/run/vocab/spm.model", "gs://b/run", str(new)) is None
    assert relocated(str(new / "vocab" / "spm.model"), str(new), str(new)) is None  # same place
