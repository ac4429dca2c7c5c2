"""Tests for keras_transformer.decoding_config: the defaults, the checks, the
round trip through an export's config.json, and the flags made from it."""

import dataclasses
import math

import pytest

from keras_transformer.decoding_config import DecodingConfig
from keras_transformer.decoding_config import positive_int

# The "translator" settings of an export's config.json as the exports written
# before DecodingConfig recorded them (Translator.settings() then).
OLD_EXPORT_SETTINGS = {
    "alpha": 0.6, "beam_size": 4, "beam_sizes": [1, 2, 4, 8], "extra_length": 50,
    "ids_only": False, "ignore_eos": False, "jit_compile": False, "max_batch_size": 256,
    "max_input_chars": 10000, "max_input_length": 128, "max_output_length": 178,
    "padded_batch_sizes": [], "padded_source_lengths": [], "precision": "float32",
    "transposed_kernels": False, "use_cache": True, "xla_max_batch_size": 0,
}


def test_the_defaults_are_the_papers_decoding():
    config = DecodingConfig()
    assert (config.beam_size, config.alpha, config.extra_length) == (4, 0.6, 50)  # Sec. 6.1
    assert config.beam_sizes == (1, 2, 4, 8)
    assert (config.max_batch_size, config.max_input_chars) == (256, 10000)
    assert (config.jit_compile, config.precision, config.xla_max_batch_size) == ("off", None, None)
    assert config.use_cache and not config.ignore_eos and config.transposed_kernels is None


@pytest.mark.parametrize("settings, message", [
    (dict(beam_size=3), "beam_size must be one of beam_sizes=(1, 2, 4, 8). Received: beam_size=3"),
    (dict(beam_sizes=(4, 0)), "beam_sizes must be a positive int. Received: beam_sizes=0"),
    (dict(beam_sizes="1,2"), "beam_sizes must be a sequence of positive ints"),
    (dict(extra_length=-1), "extra_length must be an int >= 0. Received: extra_length=-1"),
    (dict(alpha=math.nan), "alpha must be a finite number. Received: alpha=nan"),
    (dict(max_batch_size=0), "max_batch_size must be a positive int. Received: max_batch_size=0"),
    (dict(max_input_length=True), "max_input_length must be a positive int"),
    (dict(precision="int8"), "precision must be None or one of float32, bfloat16, float16, auto"),
    (dict(jit_compile="yes"), "jit_compile must be auto, on or off. Received: jit_compile='yes'"),
    (dict(xla_max_batch_size=4), "xla_max_batch_size needs jit_compile on (or auto)"),
    (dict(jit_compile="on", xla_max_batch_size=300), "at most max_batch_size=256 sentences"),
    (dict(jit_compile="on", use_cache=False), "XLA cannot compile; use jit_compile off"),
    (dict(parallel_searches=0), "parallel_searches must be a positive int"),
])
def test_a_bad_setting_is_named_with_what_was_received(settings, message):
    with pytest.raises(ValueError, match="^DecodingConfig: ") as error:
        DecodingConfig(**settings)
    assert message in str(error.value)


def test_settings_are_normalized():
    config = DecodingConfig(beam_sizes=[8, 4, 4, 1], beam_size=8, jit_compile=True, alpha=1)
    assert config.beam_sizes == (1, 4, 8) and config.jit_compile == "on" and config.xla
    assert isinstance(config.alpha, float)
    assert DecodingConfig(jit_compile=False).jit_compile == "off"
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.beam_size = 4


def test_positive_int_names_its_owner():
    assert positive_int("k", 3) == 3
    with pytest.raises(ValueError, match="^beam_search: k must be a positive int. Received: k=0$"):
        positive_int("k", 0, "beam_search")
    with pytest.raises(ValueError, match="Received: k=True"):
        positive_int("k", True)


def test_an_old_exports_settings_read_back():
    config = DecodingConfig.from_dict(OLD_EXPORT_SETTINGS)
    assert config == DecodingConfig(max_input_length=128, max_output_length=178,
                                    precision="float32", transposed_kernels=False)
    assert DecodingConfig.from_dict(config.to_dict()) == config
    xla = DecodingConfig.from_dict(dict(OLD_EXPORT_SETTINGS, jit_compile=True,
                                        xla_max_batch_size=4))
    assert (xla.jit_compile, xla.xla_max_batch_size) == ("on", 4)
    with pytest.raises(ValueError, match="unknown fields \\['beam'\\]"):
        DecodingConfig.from_dict({"beam": 4})


def test_resolved_chooses_for_this_machine(monkeypatch):
    import tensorflow as tf

    from keras_transformer import hardware

    measured = hardware.measure_cpu_matmuls(hardware.cpu_flags())  # once, for the same reason
    monkeypatch.setattr(hardware, "measure_cpu_matmuls", lambda flags: measured)

    config, notes = DecodingConfig(jit_compile="auto", xla_max_batch_size=4).resolved()
    assert config.jit_compile == "on" and notes == []  # XLA asked for small requests
    config, _ = DecodingConfig(jit_compile="auto").resolved()
    assert config.xla == bool(tf.config.list_physical_devices("GPU"))
    assert config.transposed_kernels is hardware.decoding_transposed_kernels()
    config, notes = DecodingConfig(precision="auto").resolved()
    assert config.precision in ("float32", "bfloat16")
    assert notes == [f"--precision {config.precision} (auto: "
                     f"{hardware.decoding_precision('auto', False)[1]})"]
    assert DecodingConfig(transposed_kernels=True).resolved()[0].transposed_kernels is True
    assert config.parallel_searches == hardware.decoding_parallel_searches(False)
    assert DecodingConfig(jit_compile="on").resolved()[0].parallel_searches == 1
    assert DecodingConfig(parallel_searches=3).resolved()[0].parallel_searches == 3


def test_flags_come_from_the_fields():
    from keras_transformer.cli import common
    from keras_transformer.cli import evaluate
    from keras_transformer.cli import export
    from keras_transformer.cli import translate

    args = export.parse_args(["--run", ".", "--out", "x"])
    assert args.decoding == DecodingConfig(jit_compile="auto", precision="float32")
    args = export.parse_args(["--run", ".", "--out", "x", "--beam-sizes", "2,1", "--beam-size",
                              "2", "--alpha", "1", "--jit-compile", "--precision", "bfloat16"])
    assert args.decoding == DecodingConfig(beam_sizes=(1, 2), beam_size=2, alpha=1.0,
                                           jit_compile="on", precision="bfloat16")
    for module, extra in ((translate, []), (evaluate, ["--no-progress"])):
        args = module.parse_args(["--run", ".", *extra])
        # Absent, a request setting is left to the translator (an export's defaults).
        assert (args.beam_size, args.alpha, args.extra_length) == (None, None, None)
    parser = common.OneLineErrorParser()
    common.add_decoding_flags(parser, ["use_cache", "max_output_length"])
    assert vars(parser.parse_args(["--no-use-cache", "--max-output-length", "9"])) == dict(
        verbose=False, use_cache=False, max_output_length=9)
