import dataclasses

import pytest

from keras_transformer import TransformerConfig


def analytic_parameter_count(config):
    """Parameters of the model, counted from Sec. 3 by hand."""
    d, h = config.d_model, config.num_heads
    embedding = config.vocab_size * d  # shared by source, target and output (Sec. 3.4)
    attention = (
        2 * (d * h * config.d_k + h * config.d_k)  # W^Q, W^K and biases
        + d * h * config.d_v + h * config.d_v  # W^V
        + h * config.d_v * d + d  # W^O
    )
    feed_forward = d * config.d_ff + config.d_ff + config.d_ff * d + d
    norm = 2 * d
    encoder_layer = attention + feed_forward + 2 * norm
    decoder_layer = 2 * attention + feed_forward + 3 * norm
    total = embedding + config.num_layers * (encoder_layer + decoder_layer)
    if config.positional_encoding == "learned":
        total += 2 * config.max_positions * d
    if config.norm_first:
        total += 2 * norm
    return total


# Table 3 / Table 2 parameter counts (millions), 37000-token vocabulary.
PAPER_PARAMETERS = {
    "base": 65, "big": 213, "b_dk16": 58, "b_dk32": 60, "c_n2": 36, "c_n4": 50, "c_n8": 80,
    "c_dmodel256": 28, "c_dmodel1024": 168, "c_dff1024": 53, "c_dff4096": 90,
}


@pytest.mark.parametrize("name", sorted(PAPER_PARAMETERS))
def test_presets_have_the_papers_parameter_counts(name):
    config = TransformerConfig.preset(name, vocab_size=37000)
    paper = PAPER_PARAMETERS[name] * 1e6
    # The paper rounds, and its exact vocabulary size is "about 37000".
    tolerance = 0.04 if name in ("base", "big") else 0.08
    assert abs(analytic_parameter_count(config) - paper) / paper < tolerance


def test_presets_are_the_papers_rows():
    base = TransformerConfig.base(vocab_size=37000)
    assert (base.num_layers, base.d_model, base.d_ff, base.num_heads, base.d_k, base.d_v) == (
        6, 512, 2048, 8, 64, 64)
    assert (base.dropout_rate, base.label_smoothing, base.norm_first) == (0.1, 0.1, False)
    big = TransformerConfig.big(vocab_size=37000)
    assert (big.d_model, big.d_ff, big.num_heads, big.d_k, big.dropout_rate) == (
        1024, 4096, 16, 64, 0.3)
    assert TransformerConfig.preset("a_h1", 100).d_k == 512
    assert TransformerConfig.preset("b_dk16", 100).d_v == 64
    assert TransformerConfig.preset("e_learned", 100).positional_encoding == "learned"
    assert TransformerConfig.big(100, dropout_rate=0.1).dropout_rate == 0.1  # EN-FR
    for name in TransformerConfig.presets():
        assert TransformerConfig.preset(name, vocab_size=100).vocab_size == 100


# Table 3's rows as ../shared/PAPER.md gives them: what each changes of base
# (N, d_model, d_ff, h, d_k, d_v, P_drop, eps_ls, positions).
TABLE_3 = {
    "a_h1": dict(num_heads=1, d_k=512, d_v=512),
    "a_h4": dict(num_heads=4, d_k=128, d_v=128),
    "a_h16": dict(num_heads=16, d_k=32, d_v=32),
    "a_h32": dict(num_heads=32, d_k=16, d_v=16),
    "b_dk16": dict(d_k=16),
    "b_dk32": dict(d_k=32),
    "c_n2": dict(num_layers=2),
    "c_n4": dict(num_layers=4),
    "c_n8": dict(num_layers=8),
    "c_dmodel256": dict(d_model=256, d_k=32, d_v=32),
    "c_dmodel1024": dict(d_model=1024, d_k=128, d_v=128),
    "c_dff1024": dict(d_ff=1024),
    "c_dff4096": dict(d_ff=4096),
    "d_dropout0": dict(dropout_rate=0.0),
    "d_dropout0.2": dict(dropout_rate=0.2),
    "d_ls0": dict(label_smoothing=0.0),
    "d_ls0.2": dict(label_smoothing=0.2),
    "e_learned": dict(positional_encoding="learned"),
}
BASE_ROW = dict(num_layers=6, d_model=512, d_ff=2048, num_heads=8, d_k=64, d_v=64,
                dropout_rate=0.1, label_smoothing=0.1, positional_encoding="sinusoidal")


@pytest.mark.parametrize("name", sorted(TABLE_3))
def test_each_table_3_preset_changes_base_as_the_paper_says(name):
    """Every field of the row, not only the one its name names: a b_dk16 built with
    d_k 32 is 3% from the paper's 58M, within the parameter count's tolerance."""
    config = TransformerConfig.preset(name, vocab_size=37000)
    expected = dict(BASE_ROW, **TABLE_3[name])
    assert {field: getattr(config, field) for field in expected} == expected
    assert set(TABLE_3) | {"base", "big"} <= set(TransformerConfig.presets())


def test_json_round_trip():
    config = TransformerConfig.preset("c_dmodel256", vocab_size=321, norm_first=True)
    assert TransformerConfig.from_json(config.to_json()) == config
    with pytest.raises(ValueError, match="unknown fields.*'d_modle'"):
        TransformerConfig.from_dict({**config.to_dict(), "d_modle": 3})


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(d_model=100, num_heads=8), "d_model=100, num_heads=8"),
        (dict(dropout_rate=-0.1), "dropout_rate=-0.1"),
        (dict(label_smoothing=1.0), "label_smoothing=1.0"),
        (dict(vocab_size=3), "vocab_size=3"),
        (dict(num_layers=0), "num_layers=0"),
        (dict(positional_encoding="rotary"), "positional_encoding='rotary'"),
        (dict(key_dim=0), "key_dim=0"),
    ],
)
def test_invalid_values_name_the_field_and_value(changes, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        dataclasses.replace(TransformerConfig.base(vocab_size=1000), **changes)


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(ValueError, match="Unknown TransformerConfig preset 'huge'.*base, big"):
        TransformerConfig.preset("huge", vocab_size=100)


def test_a_run_written_before_a_data_setting_existed_reads_what_it_trained_with():
    """A resumed run must read the batches it would have read: a config.json
    from before `unpunctuated_share` and `clause_share` reads 0 for them (the
    pairs as they were), not today's defaults; a new run gets the defaults."""
    from keras_transformer.config import TrainingConfig

    old = TrainingConfig().to_dict()
    del old["unpunctuated_share"], old["clause_share"]
    resumed = TrainingConfig.from_dict(old)
    assert (resumed.unpunctuated_share, resumed.clause_share) == (0.0, 0.0)
    assert (TrainingConfig().unpunctuated_share, TrainingConfig().clause_share) == (0.5, 0.25)
    assert (TrainingConfig.paper().unpunctuated_share, TrainingConfig.paper().clause_share) == (
        0.0, 0.0)
    with pytest.raises(ValueError, match="clause_share must be between 0 and 1"):
        TrainingConfig(clause_share=1.5)
