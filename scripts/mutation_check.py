"""Mutation check: does the test suite notice the defects a user would?

Each mutant is one line of the package changed into a defect that a user would
notice (a wrong BLEU, a worse translation, a refused request); the check applies
it to a copy of the repository, runs the tests that guard it (`-x -q`) and
counts it caught when they fail. Every mutant must be caught: a missed one is a
defect that the suite would let through.

    python scripts/mutation_check.py                 # every mutant, JSON report on stdout
    python scripts/mutation_check.py --list          # their names
    python scripts/mutation_check.py --only causal-mask-one-ahead,padding-in-the-loss
    python scripts/mutation_check.py --jobs 2        # two mutants at a time, a copy each
    python scripts/mutation_check.py --shard 2/3     # the 2nd, 5th, 8th, ... of them

Exits 1 when a mutant is missed or stale (its line is no longer in the file).
Each job has a copy of the repository and a test server there (TestServer): a
process that has imported TensorFlow and pytest, but not the package, and forks a
fresh pytest run for each mutant, so a mutant costs its tests up to their first
failure, not TensorFlow's start-up as well. A guard may be a test marked slow (the
check clears setup.cfg's -m); the mutants marked slow are those whose guard runs for a
minute or more (XLA compilations, training).

In CI as the slow test `tests/test_mutation_check.py::test_every_mutant_is_caught`, two
at a time (`--jobs 2`), a third of the mutants a run (`--shard`, from MUTATION_SHARD,
which .ci/run turns with the number of commits). On 2 cores of an Intel Xeon with AMX
(2026-12-04) the 100 fast-guarded mutants took 240 s; on an AVX2-only AMD EPYC Zen 1,
beside a test worker, 1293 s (2026-12-03), a seventh of CI's 90 minutes. On 2 cores of
an AMD EPYC Zen 4 (2026-12-03), the 74 fast-guarded mutants took 384 s with the servers,
558 s with a pytest process per mutant (whose start-up was 502 of the mutants' 1115 s);
in CI, beside a test worker, the latter took 1037 s. Name the test that catches a mutant
(the report says which did), not its whole file: the two reference-column mutants took
44 and 53 s with test_evaluation.py, 11 s with their test.
"""

import argparse
import concurrent.futures
import contextlib
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What the tests need of the repository (no .git, .venv, runs or build outputs).
COPIED = ("keras_transformer", "tests", "benchmarks", "scripts", "train.py", "export.py",
          "translate.py", "evaluate.py", "setup.cfg", "pyproject.toml", "README.md")


def mutant(name, path, old, new, tests, slow=False):
    """A defect: in `path`, the line whose stripped text is `old` becomes `new`
    (same indentation); `tests`: the pytest arguments that must fail; `slow`: they
    run for a minute or more (`--skip-slow` leaves such a mutant out)."""
    return {"name": name, "path": path, "old": old, "new": new, "tests": list(tests),
            "slow": slow}


MUTANTS = [
    # evaluate scores against the sources instead of the references.
    mutant("reference-column", "keras_transformer/evaluation.py",
           'references += [t.decode("utf-8") for t in block["target"]]',
           'references += [t.decode("utf-8") for t in block["source"]]',
           ["tests/test_evaluation.py::test_evaluate_scores_against_the_targets"]),
    mutant("reference-column-of-lists", "keras_transformer/evaluation.py",
           "return [source for source, _ in pairs], [target for _, target in pairs]",
           "return [source for source, _ in pairs], [source for source, _ in pairs]",
           ["tests/test_evaluation.py::test_evaluate_scores_against_the_targets"]),
    # "Tokenized BLEU" with sacreBLEU's default tokenization: not the paper's number.
    mutant("tokenized-bleu-13a", "keras_transformer/evaluation.py",
           'tokenized = sacrebleu.metrics.BLEU(tokenize="intl")',
           'tokenized = sacrebleu.metrics.BLEU(tokenize="13a")',
           ["tests/test_evaluation.py"]),
    # train averages the first --average-last checkpoints instead of the last.
    mutant("average-first-checkpoints", "keras_transformer/runs.py",
           "return [path for _, path in self.list()][-count:]",
           "return [path for _, path in self.list()][:count]",
           ["tests/test_train_cli.py::test_any_step_count_model_flags_and_resume_checks"],
           slow=True),
    mutant("average-without-dividing", "keras_transformer/runs.py",
           "averaged = [(t / len(paths)).astype(w.dtype) for t, w in zip(total, "
           "model.get_weights())]",
           "averaged = [(t / (len(paths) + 1)).astype(w.dtype) for t, w in zip(total, "
           "model.get_weights())]",
           ["tests/test_training.py", "tests/test_runs.py"]),
    # Sec. 3.2.1: scores scaled by 1/d_k instead of 1/sqrt(d_k).
    mutant("attention-scaled-by-1/d_k", "keras_transformer/layers/attention.py",
           "query = ops.multiply(query, ops.cast(1.0 / math.sqrt(self.key_dim), query.dtype))",
           "query = ops.multiply(query, ops.cast(1.0 / self.key_dim, query.dtype))",
           ["tests/layers/test_attention.py"]),
    # The decoder sees the next target token.
    mutant("causal-mask-one-ahead", "keras_transformer/layers/attention.py",
           "causal = ops.expand_dims(query_positions, -1) >= ops.expand_dims(key_positions, 0)",
           "causal = ops.expand_dims(query_positions, -1) + 1 >= "
           "ops.expand_dims(key_positions, 0)",
           ["tests/layers/test_attention.py"]),
    # Padding tokens count in the loss's mean.
    mutant("padding-in-the-loss", "keras_transformer/losses.py",
           'real = ops.cast(ops.not_equal(y_true, self.padding_id), "float32")',
           'real = ops.cast(ops.greater_equal(y_true, 0), "float32")',
           ["tests/test_losses.py"]),
    # Label smoothing's uniform share of the gradient over the wrong count.
    mutant("label-smoothing-gradient", "keras_transformer/losses.py",
           "result = (tf.exp(logits - log_normalizer[..., None]) - epsilon / vocab_size) "
           "* upstream",
           "result = (tf.exp(logits - log_normalizer[..., None]) - epsilon / (vocab_size - 1)) "
           "* upstream",
           ["tests/test_losses.py"]),
    # Sec. 3.5: cosines on even channels, sines on odd ones.
    mutant("sin-cos-swapped", "keras_transformer/layers/positional_encoding.py",
           "encoding = ops.stack([ops.sin(angles), ops.cos(angles)], axis=-1)  # (T, d/2, 2)",
           "encoding = ops.stack([ops.cos(angles), ops.sin(angles)], axis=-1)  # (T, d/2, 2)",
           ["tests/layers/test_positional_encoding.py"]),
    # Sec. 3.4: embeddings not scaled by sqrt(d_model).
    mutant("embedding-unscaled", "keras_transformer/layers/embedding.py",
           "return ops.multiply(embedded, ops.cast(math.sqrt(self.d_model), embedded.dtype))",
           "return ops.multiply(embedded, ops.cast(1.0, embedded.dtype))",
           ["tests/layers/test_embedding.py"]),
    # Dropout left on when translating.
    mutant("dropout-at-inference", "keras_transformer/layers/dropout.py",
           "if not training or self.rate == 0:",
           "if self.rate == 0:",
           ["tests/layers/test_dropout.py"]),
    # A request of exactly max_batch_size sentences is refused.
    mutant("request-limit-off-by-one", "keras_transformer/serving_text.py",
           "tf.shape(inputs)[0], self.max_batch_size,",
           "tf.shape(inputs)[0], self.max_batch_size - 1,",
           ["tests/test_serving.py::test_request_limits_admit_exactly_their_value"]),
    mutant("character-limit-off-by-one", "keras_transformer/serving_text.py",
           "longest, self.max_input_chars,",
           "longest, self.max_input_chars - 1,",
           ["tests/test_serving.py::test_request_limits_admit_exactly_their_value"]),
    # GNMT's length penalty ((5 + |Y|) / 6)^alpha with another base.
    mutant("length-penalty-base", "keras_transformer/beam_steps.py",
           "return tf.pow((5.0 + length) / 6.0, alpha)",
           "return tf.pow((1.0 + length) / 6.0, alpha)",
           ["tests/test_decoding.py"]),
    # Sec. 5.3: warm-up with step * warmup_steps^-0.5 instead of ^-1.5.
    mutant("warmup-exponent", "keras_transformer/schedules.py",
           "rate = ops.minimum(ops.power(step_num, -0.5), step_num * ops.power(warmup, -1.5))",
           "rate = ops.minimum(ops.power(step_num, -0.5), step_num * ops.power(warmup, -0.5))",
           ["tests/test_schedules.py"]),
    # Checkpoints pruned one too many: fewer left than are averaged.
    mutant("checkpoints-kept-one-fewer", "keras_transformer/training.py",
           "for _, old in self.checkpoints.list()[: -self.keep]:",
           "for _, old in self.checkpoints.list()[: -self.keep + 1]:",
           ["tests/test_training.py"]),
    # Outputs one token longer than source length + extra_length.
    mutant("output-limit-off-by-one", "keras_transformer/serving_shapes.py",
           "output_limits = tf.where(padded_lengths > 0, padded_lengths + extra_length, 1)",
           "output_limits = tf.where(padded_lengths > 0, padded_lengths + extra_length + 1, 1)",
           ["tests/test_serving.py::test_each_row_stops_at_its_own_output_limit"]),
    # translate --alpha and --weights ignored.
    mutant("translate-alpha-ignored", "keras_transformer/cli/translate.py",
           "settings = {name: getattr(args, name) for name in REQUEST_SETTINGS}",
           "settings = {name: getattr(args, name) for name in REQUEST_SETTINGS "
           "if name != 'alpha'}",
           ["tests/test_cli.py::test_decoding_flags_and_weights_reach_the_search"]),
    # translate reads a terminal or a pipe to its end before answering: a person
    # typing sees nothing until Ctrl-D, a program waiting for each answer hangs.
    mutant("translate-stdin-read-to-its-end", "keras_transformer/cli/translate.py",
           "streaming = streams(args)", "streaming = False",
           ["tests/test_cli.py::test_translate_answers_a_pipe_or_a_terminal_line_by_line"]),
    # stdin answered line by line: a line in Windows-1252 translated without a word.
    mutant("streamed-not-utf8-unsaid", "keras_transformer/cli/translate.py",
           "first_not_utf8(read + len(lines))", "pass",
           ["tests/test_cli.py::test_stdin_chunks_answer_each_line_once_no_more_are_waiting",
            "tests/test_cli.py::test_translate_answers_a_pipe_or_a_terminal_line_by_line"]),
    mutant("stdin-chunks-wait-for-more-lines", "keras_transformer/cli/translate.py",
           "if lines and (len(lines) >= most or not select.select([fd], [], [], 0)[0]):",
           "if lines and len(lines) >= most:",
           ["tests/test_cli.py::test_stdin_chunks_answer_each_line_once_no_more_are_waiting"]),
    # translate answering stdin makes the translator's first call on the first line.
    mutant("translate-first-call-on-the-first-line", "keras_transformer/cli/translate.py",
           "warmed_up = warm_up(translator, settings)", "warmed_up = lambda: None",
           ["tests/test_cli.py::"
            "test_translate_answering_stdin_makes_its_first_call_before_the_first_line"]),
    # A run's directory passed as --export: "holds no SavedModel", not which flag.
    # train chooses the decoding and scores its test BLEU in bfloat16 after a
    # mixed_bfloat16 run, while its export and --run commands decode in float32.
    mutant("train-translates-in-its-training-precision", "keras_transformer/cli/common.py",
           "model = model if model.precision == RUN_PRECISION else model.with_dtype("
           "RUN_PRECISION)", "pass",
           ["tests/test_train_cli.py::test_train_translates_as_its_export_and_run_commands_do"]),
    # A missing test file is found once training has ended, not as it starts.
    mutant("test-file-unchecked-at-the-start", "keras_transformer/cli/train.py",
           "check_corpus_files(config.data, used_splits(config))",
           'check_corpus_files(config.data, ("train", "dev"))',
           ["tests/test_train_cli.py::test_the_dev_and_test_files_are_checked_before_training"]),
    # evaluate without --test scores the bundled pairs, whatever the run trained on.
    mutant("evaluate-ignores-the-runs-corpus", "keras_transformer/cli/evaluate.py",
           "trained = trained_corpus(args) if test is None else None", "trained = None",
           ["tests/test_cli.py::test_evaluate_scores_the_corpus_the_run_trained_on_unless_told"]),
    # Training pairs whose source is a held-out pair's stay: test pairs scored where learned.
    mutant("held-out-sources-left-in-train", "keras_transformer/data/corpora.py",
           "roles[left_out] = -1", "pass",
           ["tests/data/test_corpora.py::"
            "test_hold_out_draws_dev_and_test_with_the_seed_and_keeps_their_sources_out_of_train"]),
    # A TFDS run's dev pairs asked for as "dev", a split TFDS does not have.
    mutant("tfds-dev-split-unnamed", "keras_transformer/cli/common.py",
           "return {split: corpora.load_parallel(source, names.get(split, split), **options)",
           "return {split: corpora.load_parallel(source, split, **options)",
           ["tests/test_train_cli.py::test_read_splits_reads_each_split_as_the_corpus_holds_it"]),
    # Too small a --vocab-size: the library's argument name, not the flag.
    mutant("vocab-size-error-in-library-words", "keras_transformer/cli/train.py",
           'raise ValueError(as_flags(error, ["vocab_size"], ("SubwordTokenizer.train",))) '
           "from None", "raise",
           ["tests/test_train_cli.py::"
            "test_too_small_a_vocabulary_names_the_flag_and_the_size_that_fits"]),
    # The decoding commands optimize each search's graph on its first call (seconds).
    mutant("decoding-graphs-optimized", "keras_transformer/cli/common.py",
           'tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})',
           "pass",
           ["tests/test_cli.py::"
            "test_decoding_commands_run_without_the_graph_optimizer_and_restore_it"]),
    mutant("stopped-run-checkpoints-not-averaged", "keras_transformer/runs.py",
           "steps = self.average_newest_checkpoints(model, training.average_last)",
           "steps = self.average_newest_checkpoints(model, 1)",
           ["tests/test_runs.py::"
            "test_a_stopped_run_says_what_to_do_and_translates_with_its_checkpoints"]),
    mutant("checkpoint-removed-while-read-fails", "keras_transformer/runs.py",
           "if not all(os.path.exists(path) for _, path in newest):", "if False:",
           ["tests/test_runs.py::"
            "test_checkpoints_removed_while_read_are_replaced_by_the_newer_ones"]),
    mutant("weights-cut-short-unexplained", "keras_transformer/runs.py",
           "raise UnreadableWeights(path, _file_problem(path, error)) from None", "raise",
           ["tests/test_runs.py::"
            "test_weights_cut_short_name_the_file_what_is_wrong_and_what_to_do"]),
    mutant("checkpoint-cut-short-without-advice", "keras_transformer/runs.py",
           "if isinstance(error, UnreadableWeights):", "if False:",
           ["tests/test_cli.py::"
            "test_a_checkpoint_cut_short_is_one_line_from_each_decoding_command"]),
    mutant("tfds-download-failure-unexplained", "keras_transformer/data/corpora.py",
           "except requests.exceptions.RequestException as error:",
           "except ImportError as error:",
           ["tests/data/test_corpora.py::"
            "test_an_unprepared_tfds_corpus_downloads_and_says_why_it_could_not"]),
    mutant("tfds-deprecated-dtype-warnings", "keras_transformer/data/corpora.py",
           'if getattr(feature, "tf_dtype", None) == tf.string and not getattr(feature, "shape", (1,))',
           'if getattr(feature, "dtype", None) == tf.string and not getattr(feature, "shape", (1,))',
           ["tests/data/test_corpora.py::"
            "test_an_unprepared_tfds_corpus_downloads_and_says_why_it_could_not"]),
    mutant("run-passed-as-an-export-unnamed", "keras_transformer/cli/common.py",
           "check_not_swapped(parser, export=args.export, run=args.run)", "pass",
           ["tests/test_cli.py::test_a_run_passed_as_an_export_and_an_export_as_a_run_are_named"]),
    mutant("translate-weights-ignored", "keras_transformer/cli/common.py",
           "model, tokenizer, run_config = run.load(args.weights)",
           "model, tokenizer, run_config = run.load()",
           ["tests/test_cli.py::test_decoding_flags_and_weights_reach_the_search"]),
    # A TFDS corpus offline waits out TFDS's retries (3.5 minutes) before it says why.
    mutant("tfds-offline-waits-for-the-retries", "keras_transformer/data/corpora.py",
           "unreachable = None if mocked else _unreachable(builder.url_infos)",
           "unreachable = None",
           ["tests/data/test_corpora.py::"
            "test_an_unprepared_tfds_corpus_offline_fails_at_once_naming_the_hosts"]),
    # translate --beam-size 3 of an export of 1, 2, 4, 8 waits for the load, then
    # prints TensorFlow's assertion.
    mutant("untraced-beam-size-found-after-loading", "keras_transformer/cli/common.py",
           "if traced and args.beam_size not in traced:", "if False:",
           ["tests/test_cli.py::"
            "test_request_flags_the_translator_would_refuse_are_refused_before_it_loads"]),
    mutant("evaluate-beam-size-ignored", "keras_transformer/cli/evaluate.py",
           "**{name: getattr(args, name) for name in REQUEST_SETTINGS},",
           "**{name: getattr(args, name) for name in REQUEST_SETTINGS if name != 'beam_size'},",
           ["tests/test_cli.py::test_decoding_flags_and_weights_reach_the_search"]),
    # The n-gram mask counts the start token as a generated one.
    mutant("ngram-mask-counts-the-start-token", "keras_transformer/beam_candidates.py",
           "ends = tf.broadcast_to(tf.logical_and(columns >= size - 1, columns < step),",
           "ends = tf.broadcast_to(tf.logical_and(columns >= size - 2, columns < step),",
           ["tests/test_decoding.py::TestExhaustive::"
            "test_blocking_repeated_ngrams_equals_exhaustive_search_without_them",
            "tests/test_decoding.py::TestRepeatedNgramMask::"
            "test_equals_looking_back_over_each_hypothesis"]),
    # A run blocks repeated n-grams on a tie: text that repeats itself loses it.
    mutant("choose-decoding-blocks-on-a-tie", "keras_transformer/evaluation.py",
           "blocks = block > 0 and by_alpha[alpha] > score(0, alpha)",
           "blocks = block > 0 and by_alpha[alpha] >= score(0, alpha)",
           ["tests/test_evaluation.py::"
            "test_choose_decoding_takes_the_best_alpha_then_blocks_where_that_scores_higher"]),
    # Compiling ahead restores the weights but not the optimizer: training after it
    # starts from another step, learning rate and moments.
    mutant("compile-ahead-forgets-the-optimizer", "keras_transformer/training.py",
           "for variable in [*model.variables, *model.optimizer.variables]:",
           "for variable in [*model.variables]:",
           ["tests/test_training.py::test_compiling_ahead_leaves_training_as_it_was"],
           slow=True),
    # Compiling ahead on batches of known shape: `fit` calls another trace and compiles
    # every shape again.
    mutant("compile-ahead-with-known-shapes", "keras_transformer/training.py",
           "datasets = [tf.data.Dataset.from_tensors(batch).map(_shape_unknown) for batch in group]",
           "datasets = [tf.data.Dataset.from_tensors(batch) for batch in group]",
           ["tests/test_training.py::test_compiling_ahead_leaves_training_as_it_was",
            "tests/test_train_cli.py::"
            "test_a_second_run_and_a_resumed_one_load_what_xla_compiled"], slow=True),
    # Adam's bias correction of the second moment made with beta1: steps 2.2x too
    # large at first.
    mutant("adam-second-moment-corrected-with-beta1", "keras_transformer/optimizers.py",
           "beta2_power=tf.pow(constant(self.beta_2), constant(step)),",
           "beta2_power=tf.pow(constant(self.beta_1), constant(step)),",
           ["tests/test_schedules.py::test_adam_makes_keras_adams_updates_with_fewer_ops"]),
    # SIGTERM or Ctrl-C stops a run mid-update: its checkpoint holds a partial sum of
    # gradients under the update's step, and the resumed run adds those batches again.
    mutant("stop-mid-update", "keras_transformer/training.py",
           'and not int(getattr(self.model.optimizer, "pending_batches", 0))):',
           "):",
           ["tests/test_training.py::"
            "test_a_signal_stops_training_at_its_step_with_a_checkpoint_there"]),
    # A model of the paper's width trained with the CPU recipes' warm-up.
    mutant("paper-width-gets-the-cpu-warm-up", "keras_transformer/config.py",
           "if model_config.d_model < PAPER_MIN_D_MODEL or self.time_budget:",
           "if model_config.d_model <= PAPER_MIN_D_MODEL or self.time_budget:",
           ["tests/test_runs.py::test_a_new_run_of_the_papers_width_takes_its_warm_up"]),
    # `int | None` flags (--key-dim, --value-dim) parsed as strings.
    mutant("optional-int-flags-as-strings", "keras_transformer/cli/common.py",
           'kind = {int: int, float: float, int | None: int, "int | None": int}.get(',
           'kind = {int: int, float: float, "int | None": int}.get(',
           ["tests/test_train_cli.py::test_every_model_and_training_flag_lands_in_its_config"]),
    # --precision auto trusts the CPU's bfloat16 flag, not the measured speed: a Xeon
    # whose hypervisor hides AMX then trains at two thirds of float32's speed.
    mutant("bfloat16-by-flags", "keras_transformer/hardware.py",
           "return bfloat16_pays(self.cpu_flags, self.matmul_flops)",
           "return has_bfloat16_instructions(self.cpu_flags)",
           ["tests/test_hardware.py::test_auto_fits_the_device"]),
    mutant("export-bfloat16-by-flags", "keras_transformer/hardware.py",
           'precision = "bfloat16" if bfloat16_pays(flags, matmul_flops) else "float32"',
           'precision = "bfloat16"',
           ["tests/test_decoding_precision.py"]),
    # evaluate --output loses the line of an empty translation.
    mutant("evaluate-output-lines", "keras_transformer/cli/common.py",
           'stream.writelines(text.replace("\\n", " ") + "\\n" for text in texts)',
           'stream.writelines(text.replace("\\n", " ") + "\\n" for text in texts if text)',
           ["tests/test_cli.py::test_evaluate_scores_the_reference_column_and_writes_the_output"]),
    # A full disk: Keras's HDF5 file left open, which crashed the interpreter at exit.
    mutant("hdf5-file-left-open", "keras_transformer/durable.py",
           "item.close()", "pass",
           ["tests/test_durable.py::"
            "test_a_full_disk_is_named_and_the_file_keras_left_open_is_closed"]),
    # A resumed run restores the weights but not dropout's random state.
    mutant("resume-forgets-dropouts-random-state", "keras_transformer/training.py",
           "for variable, value in zip(_rng_states(model), np.load(found.rng_path(path))):",
           "for variable, value in []:",
           ["tests/test_training.py::"
            "test_a_restored_checkpoint_draws_the_dropout_masks_the_run_would_have_drawn"]),
    # A whole checkpoint of another model: loaded where its layers fit, or set
    # aside as unreadable with every other checkpoint of the run.
    mutant("weights-of-fewer-layers-loaded", "keras_transformer/runs.py",
           "if problem:", "if False:",
           ["tests/test_runs.py::"
            "test_weights_of_another_model_are_refused_not_loaded_where_they_fit"]),
    # A loss-scale optimizer's file holds its inner optimizer's variables twice.
    mutant("loss-scale-optimizers-variables-counted-twice", "keras_transformer/runs.py",
           '"optimizer" if name.startswith("optimizer/vars/") else None)',
           '"optimizer")',
           ["tests/test_training.py::"
            "test_a_mixed_float16_checkpoint_resumes_with_its_loss_scale"]),
    mutant("another-models-checkpoint-renamed-unreadable", "keras_transformer/training.py",
           "except runs.WeightsMismatch as error:  # whole, and another model's: keep them all",
           "except ZeroDivisionError as error:",
           ["tests/test_training.py::"
            "test_a_checkpoint_of_another_model_stops_the_resume_and_renames_nothing"]),
    # Keras averages a dev pass of unknown length over one batch more than it has.
    mutant("dev-loss-over-one-batch-more", "keras_transformer/training.py",
           "dev_batches = with_known_length(without_autotuning(dev_batches))",
           "dev_batches = without_autotuning(dev_batches)",
           ["tests/test_training.py::"
            "test_a_dev_pass_averages_every_dev_batch_without_a_warning"]),
    # A full disk: the failed checkpoint's random state and time record left behind.
    mutant("half-checkpoint-kept", "keras_transformer/training.py",
           "self.checkpoints.remove(path)", "pass",
           ["tests/test_training.py::"
            "test_a_checkpoint_that_finds_the_disk_full_leaves_nothing_of_its_own"]),
    # TensorFlow's full-disk error: the file it names lost from the message.
    mutant("full-disk-file-unnamed", "keras_transformer/durable.py",
           "return OSError(number, words, path or (named and named.group(1)))",
           "return OSError(number, words, path)",
           ["tests/test_durable.py::"
            "test_tensorflows_full_disk_error_names_the_file_it_failed_on"]),
    # Runs repeated back to back: blocked inside words too (a name's repeated piece).
    mutant("adjacent-repeats-ignore-word-starts", "keras_transformer/beam_candidates.py",
           "blocked = tf.logical_and(tf.logical_and(same, starts), written)  # (N, L)",
           "blocked = tf.logical_and(same, written)  # (N, L)",
           ["tests/test_decoding.py::TestRunMasks"]),
    # "Love your neighbor as yourself." answered "y tu prójimo ...", in small letters.
    mutant("translation-first-letter-left-small", "keras_transformer/serving_text.py",
           "translations = tf.where(capital_first, _capitalized(translations), translations)",
           "pass",
           ["tests/test_serving.py::"
            "test_a_translation_starts_with_a_capital_where_its_sentence_does"]),
    # A stutter inside a word ("Jerusalenenen"): the translator does not block it.
    mutant("stutters-not-blocked", "keras_transformer/serving.py",
           'stutters = tf.strings.regex_full_match(pieces, r"\\pL+")', "stutters = None",
           ["tests/test_serving.py::"
            "test_a_translator_may_block_runs_of_words_repeated_back_to_back"]),
    # The run's choice: blocking won, but the export is not told to block adjacent runs.
    mutant("run-choice-drops-adjacent-repeats", "keras_transformer/evaluation.py",
           'settings["block_adjacent_repeats"] = True', "pass",
           ["tests/test_evaluation.py::test_choose_decoding_blocks_on_the_blocking_translator"]),
    # The export of a run that stopped before its end decodes as the paper does.
    mutant("stopped-run-exported-unchosen", "keras_transformer/cli/export.py",
           'if args.weights == "checkpoints" and not run.decoding_chosen() and any(',
           "if False and any(",
           ["tests/test_cli.py::test_export_of_a_stopped_run_chooses_its_decoding_on_its_dev_pairs"]),
    # translate --run of a stopped run: the paper's decoding, unsaid.
    mutant("stopped-run-translated-unsaid", "keras_transformer/cli/common.py",
           'unchosen = args.weights == "checkpoints" and not run.decoding_chosen()',
           "unchosen = False",
           ["tests/test_cli.py::test_a_stopped_run_translated_says_it_has_not_chosen_its_decoding"]),
    # export: a version written whole, said to be "Nothing was exported".
    mutant("export-server-files-unsaid", "keras_transformer/cli/export.py",
           'print(f"{prog}: wrote {path}, but not TF Serving\'s files beside it: "',
           'print(f"{prog}: Nothing was exported: "',
           ["tests/test_cli.py::test_export_on_a_full_disk_says_what_it_wrote"]),
    # The vocabulary keeps text as written: "café" decomposed is another word.
    mutant("tokenizer-without-nfc", "keras_transformer/data/tokenizer.py",
           "normalization_rule_name=NFC,", 'normalization_rule_name="identity",',
           ["tests/data/test_tokenizer.py::test_every_decomposed_character_tokenizes_as_its_nfc",
            "tests/test_serving.py::"
            "test_decomposed_accents_and_invisible_characters_translate_as_plain_text"]),
    # A sentence in capitals is translated as written (noise), its answer not recased.
    mutant("all-caps-searched-as-written", "keras_transformer/serving_text.py",
           "uninformative = (_all_caps(text) | _title_case(text)",
           "uninformative = (_title_case(text)",
           ["tests/test_serving.py::"
            "test_sentences_without_telling_capitals_translate_in_their_words_usual_case"]),
    mutant("title-case-searched-as-written", "keras_transformer/serving_text.py",
           "uninformative = (_all_caps(text) | _title_case(text)",
           "uninformative = (_all_caps(text)",
           ["tests/test_serving.py::"
            "test_sentences_without_telling_capitals_translate_in_their_words_usual_case"]),
    mutant("small-letters-searched-as-written", "keras_transformer/serving_text.py",
           "| tf.strings.regex_full_match(text, SMALL_LETTERS))", ")",
           ["tests/test_serving.py::"
            "test_sentences_without_telling_capitals_translate_in_their_words_usual_case"]),
    mutant("all-caps-answered-in-small-letters", "keras_transformer/serving_text.py",
           'return tf.where(caps, tf.strings.upper(translations, encoding="utf-8"), translations)',
           "return translations",
           ["tests/test_serving.py::"
            "test_sentences_without_telling_capitals_translate_in_their_words_usual_case"]),
    # The casing puts capitals at sentence starts only, or counts capitals that
    # a sentence start forces.
    mutant("casing-table-unused", "keras_transformer/data/casing.py",
           "letters = self._usual_spelling(letters)", "pass",
           ["tests/data/test_casing.py::test_restore_equals_its_python_twin",
            "tests/test_serving.py::"
            "test_sentences_without_telling_capitals_translate_in_their_words_usual_case"]),
    mutant("casing-capitals-for-a-corpus-in-small-letters", "keras_transformer/data/casing.py",
           "if self.sentence_starts:", "if True:",
           ["tests/data/test_casing.py::test_a_text_in_small_letters_gets_no_capitals"]),
    mutant("casing-counts-forced-capitals", "keras_transformer/data/casing.py",
           "if lettered and not previous_ends:", "if True:",
           ["tests/data/test_casing.py::test_learn_counts_each_word_where_its_case_is_free"]),
    # Zero-width spaces and direction marks reach the tokenizer.
    mutant("invisible-characters-kept", "keras_transformer/serving_text.py",
           "text = tf.strings.regex_replace(text, INVISIBLE, \"\")", "pass",
           ["tests/test_serving.py::"
            "test_decomposed_accents_and_invisible_characters_translate_as_plain_text",
            "tests/test_serving.py::"
            "test_invisible_characters_are_dropped_and_whitespace_is_one_space"]),
    # The rules know each character's decomposition, not its other spellings.
    # A CTranslate2 export's translations: the paper's length penalty unused (the
    # old default, 0), the text not recased, outputs past their limit.
    mutant("ctranslate2-alpha-unused", "keras_transformer/ctranslate2_model.py",
           '"length_penalty": float(config.alpha if alpha is None else alpha),',
           '"length_penalty": 0.0 if alpha is None else float(alpha),',
           ["tests/test_ctranslate2.py::test_translator_hands_ctranslate2_our_pieces_and_settings"]),
    mutant("ctranslate2-text-not-recased", "keras_transformer/ctranslate2_model.py",
           "sources = self._tokens(text).to_list()  # the limits, the text, recased",
           "sources = self.text.tokenizer.tokenize(text).to_list()",
           ["tests/test_ctranslate2.py::test_translator_hands_ctranslate2_our_pieces_and_settings"]),
    mutant("ctranslate2-outputs-uncut", "keras_transformer/ctranslate2_model.py",
           "result.hypotheses[0][:len(sources[index]) + extra]]",
           "result.hypotheses[0]]",
           ["tests/test_ctranslate2.py::test_translator_hands_ctranslate2_our_pieces_and_settings"]),
    # export --format ctranslate2 forgets the decoding the run chose.
    mutant("ctranslate2-export-decoding-unrecorded", "keras_transformer/cli/export.py",
           "config=decoding, run=run_config)",
           "run=run_config)",
           ["tests/test_ctranslate2.py::test_export_of_a_run_records_the_decoding_it_chose_unless_told"]),
    # translate --export of a CTranslate2 export: "a training run's directory".
    mutant("ctranslate2-export-taken-for-a-run", "keras_transformer/export_files.py",
           "or is_ctranslate2_export(path))",
           ")",
           ["tests/test_ctranslate2.py::test_translate_and_evaluate_take_a_ctranslate2_export"]),
    mutant("nfc-rules-decomposition-only", "keras_transformer/data/text_normalization.py",
           "for split in range(len(order) + 1):", "for split in range(min(len(order), 0) + 1):",
           ["tests/data/test_tokenizer.py::test_canonically_equivalent_spellings_tokenize_alike"]),
    # The model and its layers, against the paper (Sec. 3, 5.4).
    mutant("pre-norm-encoder-without-its-final-norm", "keras_transformer/model.py",
           "x = x if self.encoder_norm is None else self.encoder_norm(x)", "x = x",
           ["tests/test_model.py::test_each_stack_ends_in_a_layer_norm"]),
    mutant("pre-norm-decoder-without-its-final-norm", "keras_transformer/model.py",
           "if self.decoder_norm is not None:", "if False:",
           ["tests/test_model.py::test_each_stack_ends_in_a_layer_norm"]),
    mutant("embedding-dropout-left-out", "keras_transformer/model.py",
           "return dropout(x, training=training)", "return x",
           ["tests/test_model.py::test_dropout_on_the_sums_of_embeddings_and_positions_in_both_"
            "stacks"]),
    mutant("cached-steps-positioned-at-zero", "keras_transformer/model.py",
           "x = self._embed(token_ids, self.decoder_position, self.decoder_dropout, start, "
           "training)",
           "x = self._embed(token_ids, self.decoder_position, self.decoder_dropout, 0, training)",
           ["tests/test_model.py::test_cached_step_by_step_decoding_equals_full_pass"]),
    mutant("post-norm-residual-without-dropout", "keras_transformer/layers/_sublayers.py",
           "return norm(ops.add(x, dropout(outputs, training=training))), extra",
           "return norm(ops.add(x, outputs)), extra",
           ["tests/layers/test_encoder_decoder_layers.py::test_dropout_is_active_only_in_training"]),
    mutant("pre-norm-residual-normalized-after", "keras_transformer/layers/_sublayers.py",
           "return ops.add(x, dropout(outputs, training=training)), extra",
           "return norm(ops.add(x, dropout(outputs, training=training))), extra",
           ["tests/layers/test_encoder_decoder_layers.py::test_encoder_layer_equals_numpy_twin"]),
    mutant("cross-attention-sees-source-padding", "keras_transformer/layers/decoder_layer.py",
           "attention_mask=encoder_padding_mask,  # (B, S)", "attention_mask=None,",
           ["tests/test_model.py::test_source_padding_does_not_change_logits"]),
    mutant("feed-forward-without-relu", "keras_transformer/layers/feed_forward.py",
           "hidden = self.activation(self._inner_dense(inputs, search_options=search_options))",
           "hidden = self._inner_dense(inputs, search_options=search_options)",
           ["tests/layers/test_feed_forward.py"]),
    # The search.
    mutant("search-stops-when-the-best-is-final", "keras_transformer/beam_steps.py",
           "return best_alive / largest_penalty > state.finished_scores[:, -1]",
           "return best_alive / largest_penalty > state.finished_scores[:, 0]",
           ["tests/test_decoding.py::TestExhaustive::test_beam_equals_exhaustive_search"]),
    mutant("stop-bound-without-the-limit-penalty", "keras_transformer/beam_steps.py",
           "length_penalty(state.step + 1, alpha), length_penalty(state.limits, alpha))",
           "length_penalty(state.step + 1, alpha), length_penalty(state.step + 1, alpha))",
           ["tests/test_decoding.py::TestMarkovTableBeam::test_early_stop_bound_uses_the_limit_"
            "penalty"]),
    mutant("finished-taken-from-all-candidates", "keras_transformer/beam_steps.py",
           "in_beam = tf.range(search.num_candidates) < beam_size  # (C,); top_k sorts",
           "in_beam = tf.range(search.num_candidates) < search.num_candidates",
           ["tests/test_decoding.py::TestEquivalences::test_beam_size_1_with_alpha_0_equals_"
            "greedy"]),
    mutant("examples-leaving-the-batch-lose-their-lists", "keras_transformer/beam_steps.py",
           "done_ids=tf.tensor_scatter_nd_update(state.done_ids, rows, state.finished_ids),",
           "done_ids=state.done_ids,",
           ["tests/test_decoding.py::TestExhaustive::test_beam_equals_exhaustive_search"]),
    # Training's batches and metrics.
    mutant("batch-rows-over-the-token-budget", "keras_transformer/data/batching.py",
           "[num_replicas * (tokens_per_batch // length) for length in bucket_boundaries],",
           "[num_replicas * (tokens_per_batch // length + 1) for length in bucket_boundaries],",
           ["tests/data/test_batching.py::test_budget_buckets_and_no_pair_lost"]),
    mutant("accuracy-counts-padding", "keras_transformer/metrics.py",
           'weights = ops.cast(ops.not_equal(y_true, self.padding_id), "float32")',
           'weights = ops.ones_like(y_true, "float32")',
           ["tests/test_losses.py::test_metrics_on_non_padding_tokens"]),
    mutant("long-sources-cut-without-a-word", "keras_transformer/serving.py",
           "return tokens.row_lengths() > self.config.max_input_length",
           "return tokens.row_lengths() > 2 * self.config.max_input_length",
           ["tests/test_serving.py::test_a_source_longer_than_max_input_length_is_translated_"
            "from_its_first_pieces"]),
    mutant("truncation-said-as-a-python-warning", "keras_transformer/cli/translate.py",
           "@says_warnings", "",
           ["tests/test_cli.py::test_a_line_translated_from_its_first_pieces_only_is_named_"
            "in_a_line"]),
    mutant("ctranslate2-decodes-past-its-positions", "keras_transformer/ctranslate2_model.py",
           "max_decoding_length=min(longest + extra, limit),",
           "max_decoding_length=longest + extra,",
           ["tests/test_ctranslate2.py::test_sources_near_and_past_the_position_table_"
            "translate_within_it"]),
    mutant("run-translators-refuse-paragraphs", "keras_transformer/decoding_config.py",
           'return {"beam_size": beam_size, "beam_sizes": (beam_size,), "max_input_chars": None}',
           'return {"beam_size": beam_size, "beam_sizes": (beam_size,)}',
           ["tests/test_evaluation.py::test_a_translator_without_a_character_limit_translates_a_"
            "paragraph_from_its_first_pieces"]),
    mutant("truncation-said-once-a-line-of-ours", "keras_transformer/cli/common.py",
           "if str(message) not in said:  # once, from whichever line of ours", "if True:",
           ["tests/test_train_cli.py::test_a_paragraph_in_the_dev_and_test_files_is_translated_"
            "from_its_first_pieces"], slow=True),
    mutant("dev-sentences-named-as-any", "keras_transformer/evaluation.py",
           'no_repeat_ngram_size=size, named="dev sentence")',
           "no_repeat_ngram_size=size)",
           ["tests/test_train_cli.py::test_a_paragraph_in_the_dev_and_test_files_is_translated_"
            "from_its_first_pieces"], slow=True),
    mutant("an-export-without-a-character-limit", "keras_transformer/decoding_config.py",
           "if config.max_input_chars is None:", "if False:",
           ["tests/test_saved_model.py::test_a_translator_without_a_character_limit_is_not_"
            "exported",
            "tests/test_ctranslate2.py::test_a_decoding_without_a_character_limit_is_not_"
            "exported"]),
    mutant("dev-passes-with-no-dev-pairs", "keras_transformer/cli/train.py",
           "dev_batches = None", "pass",
           ["tests/test_train_cli.py::test_pairs_left_out_for_their_length_are_counted_before_"
            "training"]),
    # Train without oneDNN where TensorFlow leaves it off (AVX2-only CPUs): its
    # translations rank near ties otherwise than its export's.
    mutant("train-without-onednn", "keras_transformer/cli/common.py",
           '"TF_ENABLE_ONEDNN_OPTS": "1"}', "}",
           ["tests/test_cli.py::test_every_command_turns_onednn_on_before_tensorflow_starts"]),
    # Dev pairs left out of the dev loss unsaid where some are kept: the dev loss
    # measures a part of the dev set, and nothing says which.
    mutant("dev-pairs-left-out-unsaid", "keras_transformer/cli/train.py",
           'elif counts["pairs_too_long"]:', "elif False:",
           ["tests/test_train_cli.py::test_pairs_left_out_for_their_length_are_counted_before_"
            "training"]),
    mutant("translations-out-of-order", "keras_transformer/evaluation.py",
           'translations[i] = text.decode("utf-8")',
           'translations[indices.index(i)] = text.decode("utf-8")',
           ["tests/test_evaluation.py::test_translate_sentences_keeps_order_across_batches"]),

    mutant("cache-slots-not-reordered", "keras_transformer/decoder_cache.py",
           "reordered = ops.take_along_axis(slots, ops.expand_dims(parents, -1), axis=1)",
           "reordered = slots",
           ["tests/test_decoder_cache.py::test_reorder_gathers_only_the_slot_table"]),
    mutant("adam-beta2-of-keras-not-the-paper", "keras_transformer/optimizers.py",
           "ADAM_SETTINGS = dict(beta_1=0.9, beta_2=0.98, epsilon=1e-9)",
           "ADAM_SETTINGS = dict(beta_1=0.9, beta_2=0.999, epsilon=1e-9)",
           ["tests/test_schedules.py::test_optimizer_uses_the_papers_adam_settings"]),
    # Export: a new version never overwrites one; the reloaded export is checked.
    mutant("next-version-counts-the-versions", "keras_transformer/saved_model.py",
           "return max(versions, default=0) + 1", "return len(versions) + 1",
           ["tests/test_saved_model.py::test_the_next_version_is_one_past_the_largest_whatever_"
            "lies_beside"]),
    mutant("export-check-ignores-score-values", "keras_transformer/saved_model.py",
           "same = want.shape == np.shape(got) and np.allclose(want, got, atol=atol)",
           "same = want.shape == np.shape(got)",
           ["tests/test_saved_model.py::test_the_export_check_refuses_other_values_shapes_and_"
            "missing_outputs"]),
    # A time budget: a resumed run counts what it spent; the plan keeps the peak rate.
    mutant("budget-resume-forgets-the-time-spent", "keras_transformer/budget.py",
           "return self.read() - self.start + self.spent_before[self.clock]",
           "return self.read() - self.start",
           ["tests/test_budget.py::test_a_resumed_budget_counts_the_whole_run"]),
    mutant("budget-stops-up-to-an-interval-late", "keras_transformer/budget.py",
           "return self.elapsed() + self._epoch_seconds / 2 >= self.budget_seconds",
           "return self.elapsed() >= self.budget_seconds",
           ["tests/test_training.py::test_training_clock_stops_at_the_epoch_end_nearest_the_"
            "budget"]),
    mutant("budget-plan-loses-the-peak-rate", "keras_transformer/budget.py",
           "scale = learning_rate_scale * math.sqrt(planned_warmup / warmup_steps)",
           "scale = learning_rate_scale",
           ["tests/test_training.py::test_budget_plan_from_the_steady_step"]),
    mutant("budget-plan-drops-a-given-scale", "keras_transformer/budget.py",
           'if "warmup_steps" not in explicit:',
           'if not {"warmup_steps", "learning_rate_scale"} & set(explicit):',
           ["tests/test_training.py::test_budget_plan_from_the_steady_step"]),
    mutant("recipe-learning-rate-ignored", "keras_transformer/cli/train.py",
           "config = dataclasses.replace(config, learning_rate_scale=recipe.learning_rate_scale)",
           "pass",
           ["tests/test_budget.py::test_train_chooses_the_recipe_from_the_steps_it_times"]),
    mutant("recipe-timing-counts-the-tracing-step", "keras_transformer/training.py",
           "return float(np.median(seconds[1:]))",
           "return float(np.median(seconds))",
           ["tests/test_budget.py::test_a_timed_step_is_the_median_of_the_steps_after_the_first"]),
    mutant("recipe-timing-mean-step", "keras_transformer/training.py",
           "return float(np.median(seconds[1:]))",
           "return float(np.mean(seconds[1:]))",
           ["tests/test_budget.py::test_a_timed_step_is_the_median_of_the_steps_after_the_first"]),
    mutant("recipe-timed-on-the-wall-clock-for-a-cpu-budget", "keras_transformer/cli/train.py",
           "clock=budget.CLOCKS[config.time_budget_clock])",
           'clock=budget.CLOCKS["wall"])',
           ["tests/test_budget.py::test_train_chooses_the_recipe_from_the_steps_it_times"]),
    mutant("recipe-timed-with-its-own-dropout-where-one-is-given", "keras_transformer/cli/train.py",
           "dropout_rate=model_config.dropout_rate if keep_dropout else recipe.dropout_rate)",
           "dropout_rate=recipe.dropout_rate)",
           ["tests/test_budget.py::test_train_chooses_the_recipe_from_the_steps_it_times"]),
    mutant("recipe-small-one-timed-where-the-large-one-is-taken", "keras_transformer/recipes.py",
           "seconds = step_seconds(recipe)",
           "seconds = [step_seconds(other) for other in recipes][recipes.index(recipe)]",
           ["tests/test_budget.py::test_the_budget_takes_the_first_recipe_that_gets_the_updates_it_needs"]),
    mutant("readme-fit-warns-that-it-shuffles-no-dataset", "README.md",
           "model.fit(batches.dataset(), steps_per_epoch=300, epochs=1, shuffle=False)  # comes shuffled",
           "model.fit(batches.dataset(), steps_per_epoch=300, epochs=1)",
           ["tests/test_readme.py::test_readme_library_example_trains_translates_and_exports"],
           slow=True),
    mutant("recipe-timing-leaves-its-names", "keras_transformer/training.py",
           "keras.backend.clear_session()",
           "pass",
           ["tests/test_budget.py::test_timing_a_step_leaves_the_names_and_the_precision_as_they_were"]),
    # The user's corpus files and the bundled corpus's direction.
    mutant("aligned-files-target-read-from-the-source", "keras_transformer/data/corpora.py",
           '"target": _without_bom(target)}).unbatch()',
           '"target": _without_bom(source)}).unbatch()',
           ["tests/data/test_corpora.py::test_aligned_files_plain_and_gzip"]),
    mutant("tsv-target-read-from-the-source", "keras_transformer/data/corpora.py",
           'return {"source": columns[:, 0], "target": columns[:, 1]}',
           'return {"source": columns[:, 0], "target": columns[:, 0]}',
           ["tests/data/test_corpora.py::test_bundled_is_english_to_spanish_and_reverses"]),
    mutant("bundled-direction-ignored", "keras_transformer/data/corpora.py",
           "if source_language == BUNDLED_LANGUAGES[0]:", "if True:",
           ["tests/data/test_corpora.py::test_bundled_is_english_to_spanish_and_reverses"]),
    mutant("misaligned-files-zipped-short", "keras_transformer/data/corpora.py",
           "if num_source != num_target:", "if False:",
           ["tests/data/test_corpora.py::test_line_counts_that_differ"]),
    # "Recipe for 1 minutes on this CPU".
    mutant("one-minute-said-as-minutes", "keras_transformer/cli/train.py",
           "return f\"{number:g} {noun}{'' if number == 1 else 's'}\"",
           "return f\"{number:g} {noun}s\"",
           ["tests/test_budget.py::test_train_chooses_the_recipe_from_the_steps_it_times"]),
    # evaluate's messages number a held-out dev or test pair as a line of the files.
    mutant("trained-split-named-by-line", "keras_transformer/cli/evaluate.py",
           "return corpus_split(corpus, args.split, seed, **languages), by_split",
           "return corpus_split(corpus, args.split, seed, **languages), by_line",
           ["tests/test_cli.py::test_evaluate_scores_the_corpus_the_run_trained_on_unless_told"]),
]


def find_line(lines, old):
    """The index of the one line whose stripped text is `old`; raises otherwise."""
    found = [i for i, line in enumerate(lines) if line.strip() == old]
    if len(found) != 1:
        raise LookupError(f"{len(found)} lines match (want 1): {old!r}")
    return found[0]


def apply(path, old, new):
    """Writes the mutant into `path`; returns the original text."""
    with open(path, encoding="utf-8") as f:
        original = f.read()
    lines = original.splitlines(keepends=True)
    i = find_line(lines, old)
    indent = lines[i][:len(lines[i]) - len(lines[i].lstrip())]
    lines[i] = indent + new + "\n"
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(lines)
    return original


def copy_repository(destination):
    for name in COPIED:
        source = os.path.join(ROOT, name)
        if os.path.isdir(source):
            shutil.copytree(source, os.path.join(destination, name),
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif os.path.exists(source):
            shutil.copy2(source, os.path.join(destination, name))


# Imported once by each job's test server, before it forks a pytest run per mutant:
# TensorFlow's start-up and the test plugins', not the package (each run imports the
# copy's package as its mutant left it).
PRELOADED = ("numpy", "tensorflow", "keras", "tensorflow_text", "sacrebleu", "h5py", "pytest")
PYTEST_ARGS = ("-x", "-q", "-p", "no:cacheprovider", "-o", "addopts=")


class TestServer:
    """A process in `copy` (its package first on the path) that has imported
    PRELOADED and forks a child per request: a pytest run, or the package's
    location. Each run starts from the server's imports, as a new process would,
    without paying TensorFlow's start-up (~7 s a mutant on 2 cores)."""

    def __init__(self, copy):
        self.copy = copy
        environment = dict(os.environ, PYTHONPATH=copy, TF_CPP_MIN_LOG_LEVEL="3",
                           KERAS_BACKEND="tensorflow")
        environment.pop("CI_NO_SKIPS", None)
        self.log = tempfile.TemporaryFile("w+", encoding="utf-8")  # its stderr
        self.process = subprocess.Popen(
            [sys.executable, os.path.join(copy, "scripts", "mutation_check.py"), "--serve"],
            cwd=copy, env=environment, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.log, text=True)

    def request(self, **request):
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        if not answer:
            self.log.seek(0)
            raise RuntimeError(f"the test server in {self.copy} stopped: {self.log.read()[-3000:]}")
        return json.loads(answer)

    def run_tests(self, tests, timeout):
        """pytest's exit status on `tests` in the copy (None on a timeout), and a summary."""
        answer = self.request(tests=list(tests), timeout=timeout)
        if answer["status"] is None:
            return None, "timed out"
        lines = [line for line in answer["output"].splitlines() if line.strip()]
        failed = [line.split()[1] for line in lines if line.startswith("FAILED ")]
        summary = lines[-1] if lines else "no output"
        return answer["status"], f"{summary}; {failed[0]} failed" if failed else summary

    def check_package_is_the_copy(self):
        """The copy's package, not the editable install's, is the one its runs import."""
        found = self.request(where=True)["output"].strip()
        if os.path.realpath(found) != os.path.realpath(self.copy):
            raise RuntimeError(f"the tests would import keras_transformer from {found}, not "
                               f"from the copy {self.copy}")

    def close(self):
        self.process.stdin.close()
        self.process.wait(timeout=60)
        self.log.close()


def _forked(request, output):
    """In the child: the request's answer, written to the file `output`; its exit status."""
    import traceback

    with open(os.devnull, "rb") as null:
        os.dup2(null.fileno(), 0)
    with open(output, "wb") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
    try:
        if request.get("where"):
            import keras_transformer

            print(os.path.dirname(os.path.dirname(keras_transformer.__file__)))
            return 0
        import pytest

        return int(pytest.main([*PYTEST_ARGS, *request["tests"]]))
    except BaseException:
        traceback.print_exc()
        return 3
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def serve():
    """TestServer's process: one JSON request a line on stdin, one answer a line on stdout."""
    import importlib
    import signal

    for name in PRELOADED:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    for line in sys.stdin:
        request = json.loads(line)
        output = os.path.join(tempfile.gettempdir(), f"mutation_check-{os.getpid()}.out")
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.setpgid(0, 0)  # its own group: a timeout stops the subprocesses it started too
            os._exit(_forked(request, output))
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)
        deadline = time.monotonic() + request.get("timeout", 900)
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                status = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                status = None
                break
            time.sleep(0.05)
        with open(output, encoding="utf-8", errors="replace") as f:
            text = f.read()
        os.remove(output)
        print(json.dumps({"status": status, "output": text}), flush=True)
    return 0


def check_mutant(server, m, timeout):
    """Applies mutant `m` to the server's copy, runs its tests there and puts the
    line back; returns its entry of the report."""
    path = os.path.join(server.copy, m["path"])
    try:
        original = apply(path, m["old"], m["new"])
    except LookupError as error:
        print(f"mutation_check: {m['name']}: STALE ({error})", file=sys.stderr, flush=True)
        return {"name": m["name"], "stale": str(error)}
    try:
        began = time.perf_counter()
        status, summary = server.run_tests(m["tests"], timeout)
    finally:
        with open(path, "w", encoding="utf-8") as f:
            f.write(original)
    # Exit status 1: a test failed. 2-5 (an error collecting, no test run)
    # and a timeout do not count as caught.
    caught = status == 1
    print(f"mutation_check: {m['name']}: {'caught' if caught else 'MISSED'} ({summary})",
          file=sys.stderr, flush=True)
    return {"name": m["name"], "path": m["path"], "tests": m["tests"], "caught": caught,
            "exit_status": status, "summary": summary,
            "seconds": round(time.perf_counter() - began, 1)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", help="comma-separated mutant names")
    parser.add_argument("--skip-slow", action="store_true",
                        help="leave out the mutants whose tests run for a minute or more")
    parser.add_argument("--baseline", action="store_true",
                        help="first run every selected test file unmutated (they must pass)")
    parser.add_argument("--shard", metavar="K/N",
                        help="only every Nth of the selected mutants, from the Kth (1 <= K "
                             "<= N): CI checks a third of them a run, in turn")
    parser.add_argument("--list", action="store_true", help="print the mutants' names")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per pytest run")
    parser.add_argument("--jobs", type=int, default=1,
                        help="mutants checked at a time, each in a copy of its own")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # TestServer's
    args = parser.parse_args(argv)
    if args.serve:
        return serve()
    selected = MUTANTS
    if args.only:
        names = args.only.split(",")
        unknown = sorted(set(names) - {m["name"] for m in MUTANTS})
        if unknown:
            parser.error(f"unknown mutants {unknown}; see --list")
        selected = [m for m in MUTANTS if m["name"] in names]
    if args.skip_slow:
        selected = [m for m in selected if not m["slow"]]
    if args.shard:
        try:
            k, n = map(int, args.shard.split("/"))
        except ValueError:
            k = n = 0
        if not 1 <= k <= n:
            parser.error(f"--shard must be K/N with 1 <= K <= N, e.g. 2/3. Received: "
                         f"--shard={args.shard}")
        selected = selected[k - 1::n]
    if args.list:
        for m in selected:
            print(m["name"])
        return 0

    report = {"mutants": [], "caught": 0, "missed": [], "stale": []}
    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        # One copy of the repository per job, and its test server: each job applies
        # its mutant to its own copy.
        servers = queue.Queue()
        for _ in range(max(1, args.jobs)):
            copy = stack.enter_context(tempfile.TemporaryDirectory(prefix="mutation_check-"))
            copy_repository(copy)
            server = TestServer(copy)
            stack.callback(server.close)
            server.check_package_is_the_copy()
            servers.put(server)
        if args.baseline:
            tests = sorted({t for m in selected for t in m["tests"]})
            status, summary = server.run_tests(tests, args.timeout * 2)
            report["baseline"] = {"tests": tests, "exit_status": status, "summary": summary}
            if status != 0:
                print(json.dumps(report, indent=2))
                print("mutation_check: the unmutated tests fail; fix them first",
                      file=sys.stderr)
                return 1

        def check(m):
            server = servers.get()
            try:
                return check_mutant(server, m, args.timeout)
            finally:
                servers.put(server)

        with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
            for result in pool.map(check, selected):  # in the mutants' order
                if "stale" in result:
                    report["stale"].append(result["name"])
                else:
                    report["caught"] += result["caught"]
                    if not result["caught"]:
                        report["missed"].append(result["name"])
                report["mutants"].append(result)
    report["total"] = len(selected)
    report["seconds"] = round(time.perf_counter() - start, 1)
    print(json.dumps(report, indent=2))
    return 1 if report["missed"] or report["stale"] else 0


if __name__ == "__main__":
    sys.exit(main())
