"""Tests for keras_transformer.decoding: greedy and beam search over step functions.

Two toy "models" drive the searches:
- a Markov table: the next-token distribution depends only on the last token,
  small enough that the expected outputs are worked out by hand below;
- a random prefix model: the logits are a sum over the whole prefix of random
  vectors indexed by (position, token), so every step depends on the full path.
  Its cached form accumulates that sum in the cache and reads only the last
  token: a wrong reordering of the cache gives wrong logits.
The beam search is compared with an exhaustive search that scores every
complete hypothesis with the same length penalty.
"""


import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import beam_candidates
from keras_transformer import decoding

PAD, BOS, EOS, A, B = 0, 1, 2, 3, 4

# Markov table: row = last token, columns = P(next token). Pad and bos are never
# generated. The pad row is read by greedy rows that have finished.
_MARKOV_PROBS = np.array(
    [
        # pad  bos   eos   a     b
        [0.0, 0.0, 0.4, 0.3, 0.3],  # after pad
        [0.0, 0.0, 0.1, 0.5, 0.4],  # after bos
        [0.0, 0.0, 0.1, 0.6, 0.3],  # after eos (only with ignore_eos)
        [0.0, 0.0, 0.4, 0.35, 0.25],  # after a
        [0.0, 0.0, 0.9, 0.05, 0.05],  # after b
    ]
)
with np.errstate(divide="ignore"):
    _MARKOV_LOGITS = tf.constant(np.log(_MARKOV_PROBS), tf.float32)  # (V, V), -inf for p=0


def _markov_fn(calls):
    """Step function over the Markov table; appends one entry to `calls` per call."""

    def symbols_to_logits_fn(ids, step, cache):
        calls.append(1)
        return tf.gather(_MARKOV_LOGITS, ids[:, step]), cache  # (N, V)

    return symbols_to_logits_fn


def _penalty(length, alpha):
    return ((5.0 + length) / 6.0) ** alpha


def _numpy(outputs):
    return tuple(t.numpy() for t in outputs)


def _pad(row, length):
    return list(row) + [PAD] * (length - len(row))


class TestLengthPenalty:
    def test_closed_form(self):
        lengths = tf.constant([1, 7, 25])
        np.testing.assert_allclose(
            decoding.length_penalty(lengths, 0.6), [1.0, 2.0**0.6, 5.0**0.6], rtol=1e-6
        )
        np.testing.assert_allclose(decoding.length_penalty(lengths, 0.0), [1.0] * 3)


class TestMarkovTableGreedy:
    def test_expected_ids_and_score(self):
        calls = []
        ids, scores = decoding.greedy_search(
            _markov_fn(calls), tf.constant([BOS]), {}, max_output_length=10, eos_id=EOS
        )
        # bos -> a (0.5) -> eos (0.4); then every row has ended: 2 steps, not 10.
        np.testing.assert_array_equal(ids, [_pad([A, EOS], 10)])
        np.testing.assert_allclose(scores, [np.log(0.5 * 0.4)], rtol=1e-6)
        assert len(calls) == 2

    def test_per_example_max_output_lengths(self):
        ids, scores = decoding.greedy_search(
            _markov_fn([]),
            tf.constant([BOS, BOS]),
            {},
            max_output_length=3,
            eos_id=EOS,
            max_output_lengths=tf.constant([1, 3]),
        )
        # Example 0 stops at its limit of 1 token, without eos.
        np.testing.assert_array_equal(ids, [[A, PAD, PAD], [A, EOS, PAD]])
        np.testing.assert_allclose(scores, np.log([0.5, 0.5 * 0.4]), rtol=1e-6)

    def test_ignore_eos_runs_exactly_max_output_length_steps(self):
        calls = []
        ids, scores = decoding.greedy_search(
            _markov_fn(calls), tf.constant([BOS]), {}, max_output_length=6, eos_id=EOS,
            ignore_eos=True
        )
        # bos -> a (.5) -> eos (.4) -> a (.6) -> eos (.4) -> a (.6) -> eos (.4)
        np.testing.assert_array_equal(ids, [[A, EOS, A, EOS, A, EOS]])
        np.testing.assert_allclose(scores, [np.log(0.5 * 0.4**3 * 0.6**2)], rtol=1e-6)
        assert len(calls) == 6


class TestMarkovTableBeam:
    def test_expected_n_best_and_early_stop(self):
        calls = []
        ids, scores = decoding.beam_search(
            _markov_fn(calls),
            tf.constant([BOS]),
            {},
            vocab_size=5,
            max_output_length=10,
            eos_id=EOS,
            beam_size=2,
            alpha=0.0,
        )
        # Step 1 candidates: a .5, b .4, eos .1; eos is 3rd, outside the beam of 2.
        # Step 2 candidates: b-eos .36, a-eos .2, a-a .175, a-b .125, b-a .02, b-b .02.
        # The top 2 both end, and the best live one (.175) cannot beat the worse
        # finished one (.2): the search stops after 2 steps, not 10.
        np.testing.assert_array_equal(ids, [[_pad([B, EOS], 10), _pad([A, EOS], 10)]])
        np.testing.assert_allclose(scores, [np.log([0.36, 0.2])], rtol=1e-6)
        assert len(calls) == 2

    def test_early_stop_bound_uses_the_limit_penalty(self):
        # After bos: eos .6, a .4; after a: a .9, eos .1. With alpha = 2 the
        # long hypothesis a^10 (score log(.4 * .9**9) / lp(10) = -1.86 / 6.25)
        # beats [eos] (log .6 / lp(1) = -0.51). At step 1 the live `a` (log .4)
        # could still reach log .4 / lp(10) = -0.15 > -0.51, so the search must
        # go on; bounding with lp(2) instead (-0.67) would stop there with [eos].
        # Example 0 has a limit of 2 tokens: [a, a] cannot beat [eos] there.
        probs = np.zeros((5, 5))
        probs[[PAD, BOS, EOS], EOS], probs[[PAD, BOS, EOS], A] = 0.6, 0.4
        probs[A, EOS], probs[A, A] = 0.1, 0.9
        with np.errstate(divide="ignore"):
            table = tf.constant(np.log(probs), tf.float32)
        calls = []

        def symbols_to_logits_fn(ids, step, cache):
            calls.append(1)
            return tf.gather(table, ids[:, step]), cache

        ids, scores = decoding.beam_search(
            symbols_to_logits_fn,
            tf.constant([BOS, BOS]),
            {},
            vocab_size=5,
            max_output_length=10,
            eos_id=EOS,
            beam_size=1,
            alpha=2.0,
            max_output_lengths=tf.constant([2, 10]),
            allow_empty=True,  # [eos] is the hypothesis to beat
        )
        np.testing.assert_array_equal(ids, [[_pad([EOS], 10)], [[A] * 10]])
        np.testing.assert_allclose(
            scores, [[np.log(0.6)], [np.log(0.4 * 0.9**9) / _penalty(10, 2.0)]], rtol=1e-6
        )
        assert len(calls) == 10

    def test_length_penalty_applied_to_scores(self):
        ids, scores = decoding.beam_search(
            _markov_fn([]),
            tf.constant([BOS]),
            {},
            vocab_size=5,
            max_output_length=3,
            eos_id=EOS,
            beam_size=2,
            alpha=0.6,
        )
        # Step 3 (the limit) finishes everything: a-b-eos .1125 is the best
        # extension, below both two-token hypotheses even with lp(3) > lp(2).
        np.testing.assert_array_equal(ids, [[[B, EOS, PAD], [A, EOS, PAD]]])
        np.testing.assert_allclose(
            scores, [np.log([0.36, 0.2]) / _penalty(2, 0.6)], rtol=1e-6
        )

    def test_per_example_max_output_lengths(self):
        ids, scores = decoding.beam_search(
            _markov_fn([]),
            tf.constant([BOS, BOS]),
            {},
            vocab_size=5,
            max_output_length=3,
            eos_id=EOS,
            beam_size=2,
            alpha=0.6,
            max_output_lengths=tf.constant([1, 3]),
        )
        # Example 0: every one-token extension is finished at its limit, lp(1) = 1.
        np.testing.assert_array_equal(
            ids, [[[A, PAD, PAD], [B, PAD, PAD]], [[B, EOS, PAD], [A, EOS, PAD]]]
        )
        np.testing.assert_allclose(
            scores,
            [np.log([0.5, 0.4]), np.log([0.36, 0.2]) / _penalty(2, 0.6)],
            rtol=1e-6,
        )

    def test_ignore_eos_runs_exactly_max_output_length_steps(self):
        calls = []
        ids, scores = decoding.beam_search(
            _markov_fn(calls),
            tf.constant([BOS]),
            {},
            vocab_size=5,
            max_output_length=7,
            eos_id=EOS,
            beam_size=2,
            alpha=0.0,
            ignore_eos=True,
        )
        assert len(calls) == 7
        # eos is an ordinary token. Step 2 keeps b-eos (.4 * .9) and a-eos
        # (.5 * .4); from then on both beams extend b-eos, the best with
        # a eos a eos a (.6 .4 .6 .4 .6). The runner-up takes one a-a (.35)
        # instead of an eos-a (.6), at one of two places with equal probability.
        # (The exact best path, b eos b eos b eos a, drops out of a beam of 2.)
        np.testing.assert_array_equal(ids[0, 0], [B, EOS, A, EOS, A, EOS, A])
        best = 0.4 * 0.9 * 0.6 * 0.4 * 0.6 * 0.4 * 0.6
        np.testing.assert_allclose(scores[0], np.log([best, best / 0.6 * 0.35]), rtol=1e-6)
        assert (ids.numpy() != PAD).all()


# Random prefix model: vocabulary pad, eos, a, b; pad is never generated.
_VOCAB = 4
_R_EOS = 1
_R_A, _R_B = 2, 3
_MAX_LENGTH = 4
_PAD_MASK = tf.constant([-np.inf] + [0.0] * (_VOCAB - 1), tf.float32)  # (V,)


class _PrefixModel:
    """logits(example b, prefix [y0, ..., yt]) = source[b] + sum_s table[s, y_s].

    `source` (B, V) stands for what the encoder says about each example; it
    enters the search through the cache, so a cache tiled or reordered the
    wrong way changes the logits. Pad gets -inf.
    """

    def __init__(self, seed, batch_size):
        rng = np.random.default_rng(seed)
        self.table = rng.normal(size=(_MAX_LENGTH + 1, _VOCAB, _VOCAB)).astype(np.float32)
        self.source = rng.normal(size=(batch_size, _VOCAB)).astype(np.float32)

    def cached_fn(self, check_path=False):
        """Reads only ids[:, step]; the running sum lives in cache["logits"] (N, V).

        cache["path"] (N, T + 1) records the tokens seen; with `check_path`,
        each step asserts that it equals the prefix in `ids`, i.e. that the
        search moved every cache row along with its hypothesis.
        """
        table = tf.constant(self.table)  # (T + 1, V, V)

        def symbols_to_logits_fn(ids, step, cache):
            last = ids[:, step]  # (N,)
            logits = cache["logits"] + tf.gather(table[step], last)  # (N, V)
            columns = tf.range(ids.shape[1])  # (T + 1,)
            path = tf.where(columns == step, last[:, tf.newaxis], cache["path"])  # (N, T + 1)
            if check_path:
                seen = columns <= step
                tf.debugging.assert_equal(tf.where(seen, path, -1), tf.where(seen, ids, -1))
            return logits + _PAD_MASK, {"logits": logits, "path": path}

        return symbols_to_logits_fn

    def cached_state(self, source=None, max_output_length=_MAX_LENGTH):
        source = tf.convert_to_tensor(self.source if source is None else source)
        return {
            "logits": source,  # (B, V)
            "path": tf.zeros([tf.shape(source)[0], max_output_length + 1], tf.int32),  # (B, T + 1)
        }

    def uncached_fn(self):
        """Reads the whole prefix ids[:, :step + 1] every step; the cache holds only source."""
        table = tf.constant(self.table)  # (T + 1, V, V)

        def symbols_to_logits_fn(ids, step, cache):
            columns = tf.range(ids.shape[1])  # (T + 1,)
            one_hot = tf.one_hot(ids, _VOCAB)  # (N, T + 1, V)
            one_hot *= tf.cast(columns <= step, tf.float32)[:, tf.newaxis]
            logits = cache["source"] + tf.einsum("ntv,tvw->nw", one_hot, table)  # (N, V)
            return logits + _PAD_MASK, cache

        return symbols_to_logits_fn

    def uncached_state(self):
        return {"source": tf.constant(self.source)}

    def exhaustive_search(self, example, start_id, max_output_length, alpha, ignore_eos=False,
                          no_repeat_ngram_size=0, allow_empty=False, word_starts=None,
                          stutters=None):
        """Every complete hypothesis with its score, best first (the slow twin).

        A hypothesis is complete when it ends in eos (unless ignore_eos) or has
        max_output_length tokens; its score is log P / lp(|Y|), |Y| counting eos.
        With `no_repeat_ngram_size` n, a hypothesis whose generated tokens hold
        an n-gram twice is not one (the others keep their probabilities);
        unless `allow_empty`, neither is [eos]; with `word_starts`, neither is
        one that repeats a run starting a word right after itself; with
        `stutters`, neither is one that ends in three of a stutter token.
        Float64 throughout.
        """
        complete = []

        def extend(prefix, log_prob):
            logits = self.source[example].astype(np.float64)
            logits = logits + sum(self.table[s, token] for s, token in enumerate(prefix))
            logits[PAD] = -np.inf
            log_probs = logits - np.logaddexp.reduce(logits)
            for token in range(_VOCAB):
                if token == PAD:
                    continue
                output = prefix[1:] + [token]
                if _repeats_an_ngram(output, no_repeat_ngram_size):
                    continue
                if word_starts is not None and _repeats_adjacently(output, word_starts):
                    continue
                if stutters is not None and _stutters(output, stutters):
                    continue
                if output == [_R_EOS] and not (allow_empty or ignore_eos):
                    continue
                total = log_prob + log_probs[token]
                if (token == _R_EOS and not ignore_eos) or len(output) == max_output_length:
                    complete.append((total / _penalty(len(output), alpha), output))
                else:
                    extend(prefix + [token], total)

        extend([start_id], 0.0)
        complete.sort(key=lambda item: -item[0])
        return complete


def _repeats_an_ngram(tokens, size):
    """Whether the last n-gram of `tokens` came before (size 0: never)."""
    grams = [tuple(tokens[i:i + size]) for i in range(len(tokens) - size + 1)]
    return size > 0 and bool(grams) and grams[-1] in grams[:-1]


def _repeats_adjacently(tokens, word_starts, longest=8):
    """Whether `tokens` end in a run of 1 to `longest` tokens, repeated right after
    itself, whose first token starts a word (`word_starts[token]`)."""
    return any(tokens[-m:] == tokens[-2 * m:-m] and word_starts[tokens[-2 * m]]
               for m in range(1, min(longest, len(tokens) // 2) + 1))


def _stutters(tokens, stutters, copies=3):
    """Whether `tokens` end in `copies` of one token that `stutters` names."""
    return (len(tokens) >= copies and len(set(tokens[-copies:])) == 1
            and bool(stutters[tokens[-1]]))


def _select_tiled(beam_size):
    """`select_examples` for a cache tiled to K rows per example, batch-major."""

    def select(cache, examples):
        def take(t):
            by_example = tf.reshape(t, [-1, beam_size, *t.shape[1:]])  # (B, K, ...)
            return tf.reshape(tf.gather(by_example, examples), [-1, *t.shape[1:]])

        return tf.nest.map_structure(take, cache)

    return select


class TestExhaustive:
    # beam_size 12 makes the search exact here: at step t < 4 at most
    # 3 * 2**(t-1) <= 12 candidates exist and at most 2**3 = 8 live hypotheses,
    # so none is pruned before the last step, where the best K of the
    # equal-length candidates are kept.
    @pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
    @pytest.mark.parametrize("leave", [False, True], ids=["", "leaving-the-batch"])
    @pytest.mark.parametrize("allow_empty", [False, True], ids=["", "allowing-empty"])
    def test_beam_equals_exhaustive_search(self, alpha, leave, allow_empty):
        model = _PrefixModel(seed=0, batch_size=3)
        starts, limits, beam_size = [_R_A, _R_B, _R_A], [4, 3, 2], 12
        ids, scores = _numpy(
            decoding.beam_search(
                model.cached_fn(check_path=True),
                tf.constant(starts),
                model.cached_state(),
                vocab_size=_VOCAB,
                max_output_length=_MAX_LENGTH,
                eos_id=_R_EOS,
                beam_size=beam_size,
                alpha=alpha,
                max_output_lengths=tf.constant(limits),
                # The examples reach their limits one a step and leave the batch.
                select_examples=_select_tiled(beam_size) if leave else None,
                allow_empty=allow_empty,
            )
        )
        for b, (start, limit) in enumerate(zip(starts, limits)):
            expected = model.exhaustive_search(b, start, limit, alpha,
                                               allow_empty=allow_empty)[:beam_size]
            found = len(expected)  # 12 of 31, 12 of 15, all 7 (30, 14, 6 without [eos])
            np.testing.assert_allclose(
                scores[b, :found], [score for score, _ in expected], rtol=1e-5
            )
            np.testing.assert_array_equal(
                ids[b, :found], [_pad(output, _MAX_LENGTH) for _, output in expected]
            )
            # Missing hypotheses (7 < 12 for the limit of 2) are marked as such.
            np.testing.assert_array_equal(scores[b, found:], -np.inf)
            np.testing.assert_array_equal(ids[b, found:], PAD)
        assert found == (7 if allow_empty else 6)
        # [eos] ranks among the best 12 of each example, so leaving it out shows.
        assert all([_R_EOS] in [output for _, output in model.exhaustive_search(
            b, start, limit, alpha, allow_empty=True)[:beam_size]]
            for b, (start, limit) in enumerate(zip(starts, limits)))

    @pytest.mark.parametrize("size, stutter", [(0, False), (2, False), (0, True)])
    def test_beam_blocking_adjacent_repeats_equals_exhaustive_search(self, size, stutter):
        """a starts a word, b does not: "a a" and "a b a b" are blocked, "b b"
        and "b a b a" are not; with 2-grams blocked too, both apply; with b a
        stutter token, "b b b" is blocked too (its third b)."""
        model = _PrefixModel(seed=3, batch_size=3)
        word_starts = [False, False, True, False]  # pad, eos, a, b
        stutters = [False, False, False, True] if stutter else None
        starts, limits, beam_size = [_R_A, _R_B, _R_A], [4, 4, 3], 12
        ids, scores = _numpy(decoding.beam_search(
            model.cached_fn(check_path=True), tf.constant(starts), model.cached_state(),
            vocab_size=_VOCAB, max_output_length=_MAX_LENGTH, eos_id=_R_EOS,
            beam_size=beam_size, alpha=0.6, max_output_lengths=tf.constant(limits),
            no_repeat_ngram_size=size, block_adjacent_repeats=word_starts,
            block_stutters=stutters))
        blocked_any = False
        for b, (start, limit) in enumerate(zip(starts, limits)):
            expected = model.exhaustive_search(b, start, limit, 0.6, no_repeat_ngram_size=size,
                                               word_starts=word_starts,
                                               stutters=stutters)[:beam_size]
            unblocked = model.exhaustive_search(b, start, limit, 0.6, no_repeat_ngram_size=size,
                                                word_starts=word_starts)[:beam_size]
            if not stutter:
                unblocked = model.exhaustive_search(b, start, limit, 0.6,
                                                    no_repeat_ngram_size=size)[:beam_size]
            blocked_any |= expected != unblocked
            found = len(expected)
            np.testing.assert_allclose(scores[b, :found], [s for s, _ in expected], rtol=1e-5)
            np.testing.assert_array_equal(
                ids[b, :found], [_pad(output, _MAX_LENGTH) for _, output in expected])
            np.testing.assert_array_equal(scores[b, found:], -np.inf)
        assert blocked_any

    @pytest.mark.parametrize("beam_size", [1, 4])
    def test_an_empty_output_is_left_out_even_at_a_limit_of_one_token(self, beam_size):
        """The model ranks eos first for every source; at a limit of 1 every
        candidate is finished, and still not [eos]. Greedy search agrees."""
        model = _PrefixModel(seed=0, batch_size=2)
        source = model.source.copy()
        source[:, _R_EOS] = 10.0  # P(eos first) > 0.99
        args = dict(max_output_length=_MAX_LENGTH, eos_id=_R_EOS,
                    max_output_lengths=tf.constant([1, _MAX_LENGTH]))
        ids, scores = _numpy(decoding.beam_search(
            model.cached_fn(check_path=True), tf.constant([_R_A, _R_B]),
            model.cached_state(source), vocab_size=_VOCAB, beam_size=beam_size, alpha=0.6,
            **args))
        model.source = source
        best_token = model.exhaustive_search(0, _R_A, 1, 0.6)[0][1]  # one token, not eos
        for b, (start, limit) in enumerate([(_R_A, 1), (_R_B, _MAX_LENGTH)]):
            expected = model.exhaustive_search(b, start, limit, 0.6)
            assert model.exhaustive_search(b, start, limit, 0.6, allow_empty=True)[0][1] == [
                _R_EOS]
            if beam_size == 4 or b == 0:  # a beam of 1 is exact at one step only
                np.testing.assert_allclose(scores[b, 0], expected[0][0], rtol=1e-5)
                np.testing.assert_array_equal(ids[b, 0], _pad(expected[0][1], _MAX_LENGTH))
            assert ids[b, 0, 0] != _R_EOS
        greedy_ids, _ = _numpy(decoding.greedy_search(
            model.cached_fn(), tf.constant([_R_A, _R_B]), model.cached_state(source), **args))
        assert (greedy_ids[:, 0] != _R_EOS).all()
        np.testing.assert_array_equal(greedy_ids[0], _pad(best_token, _MAX_LENGTH))

    @pytest.mark.parametrize("size", [1, 2])
    @pytest.mark.parametrize("leave", [False, True], ids=["", "leaving-the-batch"])
    def test_blocking_repeated_ngrams_equals_exhaustive_search_without_them(self, size, leave):
        """The start token is no part of an n-gram: starting from a, a may
        still come first."""
        model = _PrefixModel(seed=3, batch_size=3)
        starts, limits, beam_size = [_R_A, _R_B, _R_A], [4, 4, 3], 12
        ids, scores = _numpy(
            decoding.beam_search(
                model.cached_fn(check_path=True), tf.constant(starts), model.cached_state(),
                vocab_size=_VOCAB, max_output_length=_MAX_LENGTH, eos_id=_R_EOS,
                beam_size=beam_size, alpha=0.6, max_output_lengths=tf.constant(limits),
                no_repeat_ngram_size=size,
                select_examples=_select_tiled(beam_size) if leave else None,
            )
        )
        unblocked = model.exhaustive_search(0, _R_A, 4, 0.6)
        assert any(_repeats_an_ngram(output[:end], size) for _, output in unblocked
                   for end in range(1, len(output) + 1))  # there is something to block
        for b, (start, limit) in enumerate(zip(starts, limits)):
            expected = model.exhaustive_search(b, start, limit, 0.6,
                                               no_repeat_ngram_size=size)[:beam_size]
            found = len(expected)
            np.testing.assert_allclose(scores[b, :found], [score for score, _ in expected],
                                       rtol=1e-5)
            np.testing.assert_array_equal(
                ids[b, :found], [_pad(output, _MAX_LENGTH) for _, output in expected])
            np.testing.assert_array_equal(scores[b, found:], -np.inf)
            if b == 0:  # the start token a is not counted: a may come first
                assert any(output[0] == _R_A for _, output in expected)

    def test_ignore_eos_equals_exhaustive_search(self):
        # 3**t <= 9 live hypotheses at step t < 3: exact with beam_size 9.
        model = _PrefixModel(seed=1, batch_size=1)
        ids, scores = _numpy(
            decoding.beam_search(
                model.cached_fn(check_path=True),
                tf.constant([_R_B]),
                model.cached_state(max_output_length=3),
                vocab_size=_VOCAB,
                max_output_length=3,
                eos_id=_R_EOS,
                beam_size=9,
                alpha=0.6,
                ignore_eos=True,
            )
        )
        expected = model.exhaustive_search(0, _R_B, 3, 0.6, ignore_eos=True)[:9]
        np.testing.assert_allclose(scores[0], [score for score, _ in expected], rtol=1e-5)
        np.testing.assert_array_equal(ids[0], [output for _, output in expected])
        assert (ids[0, :, :2] == _R_EOS).any()  # eos went through without ending


class TestEquivalences:
    def test_cached_equals_uncached(self):
        model = _PrefixModel(seed=2, batch_size=3)
        starts = tf.constant([_R_A, _R_B, _R_B])
        kwargs = dict(vocab_size=_VOCAB, max_output_length=_MAX_LENGTH, eos_id=_R_EOS, beam_size=3)
        cached = _numpy(
            decoding.beam_search(
                model.cached_fn(check_path=True), starts, model.cached_state(), **kwargs
            )
        )
        uncached = _numpy(
            decoding.beam_search(model.uncached_fn(), starts, model.uncached_state(), **kwargs)
        )
        np.testing.assert_array_equal(cached[0], uncached[0])
        np.testing.assert_allclose(cached[1], uncached[1], rtol=1e-5)

    @pytest.mark.parametrize("allow_empty", [False, True], ids=["", "allowing-empty"])
    def test_beam_size_1_with_alpha_0_equals_greedy(self, allow_empty):
        model = _PrefixModel(seed=6, batch_size=6)
        starts = tf.constant([_R_A, _R_B, _R_A, _R_B, _R_A, _R_B])
        limits = tf.constant([4, 4, 4, 4, 3, 1])

        def greedy(allow_empty):
            return _numpy(decoding.greedy_search(
                model.cached_fn(), starts, model.cached_state(), max_output_length=_MAX_LENGTH,
                eos_id=_R_EOS, max_output_lengths=limits, allow_empty=allow_empty))

        greedy_ids, greedy_scores = greedy(allow_empty)
        beam_ids, beam_scores = _numpy(
            decoding.beam_search(
                model.cached_fn(), starts, model.cached_state(), vocab_size=_VOCAB,
                max_output_length=_MAX_LENGTH, eos_id=_R_EOS, beam_size=1, alpha=0.0,
                max_output_lengths=limits, allow_empty=allow_empty,
            )
        )
        # Every way of ending occurs: eos at once (left out unless allowed), eos
        # later, the limit.
        assert (greedy(True)[0][:, 0] == _R_EOS).any()
        assert (greedy_ids[:, 0] == _R_EOS).any() == allow_empty
        assert (greedy_ids[:, 1:] == _R_EOS).any()
        assert (greedy_ids[:, -1] != _R_EOS).any() and (greedy_ids[:, -1] != PAD).any()
        np.testing.assert_array_equal(beam_ids[:, 0], greedy_ids)
        np.testing.assert_allclose(beam_scores[:, 0], greedy_scores, rtol=1e-6)


    @pytest.mark.parametrize("size, adjacent", [(1, False), (2, False), (3, False),
                                                (0, True), (3, True)])
    def test_beam_size_1_with_alpha_0_equals_greedy_when_blocking_repeats(self, size, adjacent):
        model = _PrefixModel(seed=8, batch_size=6)
        starts = tf.constant([_R_A, _R_B, _R_A, _R_B, _R_A, _R_B])
        word_starts = np.array([False, False, True, True])  # (V,): a and b start words
        kwargs = dict(max_output_length=_MAX_LENGTH, eos_id=_R_EOS, no_repeat_ngram_size=size,
                      block_adjacent_repeats=word_starts if adjacent else None)
        greedy_ids, greedy_scores = _numpy(decoding.greedy_search(
            model.cached_fn(), starts, model.cached_state(), **kwargs))
        beam_ids, beam_scores = _numpy(decoding.beam_search(
            model.cached_fn(), starts, model.cached_state(), vocab_size=_VOCAB, beam_size=1,
            alpha=0.0, **kwargs))
        np.testing.assert_array_equal(beam_ids[:, 0], greedy_ids)
        np.testing.assert_allclose(beam_scores[:, 0], greedy_scores, rtol=1e-6)
        unblocked_ids, _ = _numpy(decoding.greedy_search(
            model.cached_fn(), starts, model.cached_state(), max_output_length=_MAX_LENGTH,
            eos_id=_R_EOS))
        blocked_any = False
        for row, unblocked in zip(greedy_ids, unblocked_ids):
            tokens = [token for token in row if token != PAD]
            free = [token for token in unblocked if token != PAD]
            prefixes = [tokens[:end] for end in range(1, len(tokens) + 1)]
            assert not any(_repeats_an_ngram(prefix, size) for prefix in prefixes if size)
            assert not any(_repeats_adjacently(prefix, word_starts)
                           for prefix in prefixes if adjacent)
            blocked_any |= any(_repeats_adjacently(free[:end], word_starts)
                               for end in range(1, len(free) + 1))
        assert blocked_any  # the model, left alone, repeats

    def test_beam_size_1_with_alpha_0_equals_greedy_when_blocking_stutters(self):
        """b, inside a word, is never taken a third time in a row; a, a word's
        start, blocks runs repeated back to back."""
        model = _PrefixModel(seed=4, batch_size=6)
        starts = tf.constant([_R_A, _R_B, _R_A, _R_B, _R_A, _R_B])
        word_starts = np.array([False, False, True, False])
        stutters = np.array([False, False, False, True])
        kwargs = dict(max_output_length=_MAX_LENGTH, eos_id=_R_EOS,
                      block_adjacent_repeats=word_starts)
        greedy_ids, greedy_scores = _numpy(decoding.greedy_search(
            model.cached_fn(), starts, model.cached_state(), block_stutters=stutters, **kwargs))
        beam_ids, beam_scores = _numpy(decoding.beam_search(
            model.cached_fn(), starts, model.cached_state(), vocab_size=_VOCAB, beam_size=1,
            alpha=0.0, block_stutters=stutters, **kwargs))
        np.testing.assert_array_equal(beam_ids[:, 0], greedy_ids)
        np.testing.assert_allclose(beam_scores[:, 0], greedy_scores, rtol=1e-6)
        unblocked_ids, _ = _numpy(decoding.greedy_search(
            model.cached_fn(), starts, model.cached_state(), **kwargs))
        tokens = [[token for token in row if token != PAD] for row in greedy_ids]
        free = [[token for token in row if token != PAD] for row in unblocked_ids]
        assert not any(_stutters(row[:end], stutters)
                       for row in tokens for end in range(1, len(row) + 1))
        assert any(_stutters(row[:end], stutters)  # the model, left alone, stutters
                   for row in free for end in range(1, len(row) + 1))


class TestRepeatedNgramMask:
    @pytest.mark.parametrize("size", [1, 2, 3, 4])
    def test_equals_looking_back_over_each_hypothesis(self, size):
        rng = np.random.default_rng(size)
        rows, columns, vocab = 7, 12, 5
        # Few tokens: many repeated n-grams. Column 0 is the start token.
        ids = rng.integers(0, 3, size=(rows, columns)).astype("int32")
        ids[:, 0] = 4
        for step in range(columns):
            buffer = ids.copy()
            buffer[:, step + 1:] = 0  # padding after the last written column
            mask = beam_candidates.blocked_mask(vocab, beam_candidates.repeated_ngrams(
                tf.constant(buffer), tf.constant(step), size)).numpy()
            for row in range(rows):
                generated = list(buffer[row, 1:step + 1])
                expected = [
                    -np.inf if _repeats_an_ngram(generated + [token], size) else 0.0
                    for token in range(vocab)]
                np.testing.assert_array_equal(mask[row], expected, err_msg=f"{step=} {row=}")
        assert np.isinf(mask).any() and (mask == 0).any()


class TestRunMasks:
    @pytest.mark.parametrize("blocker, twin, seed, start", [
        (beam_candidates.adjacent_repeats, _repeats_adjacently, 0, "other"),
        (beam_candidates.stuttered_pieces, _stutters, 1, "blocked"),
    ], ids=["adjacent-repeats", "stutters"])
    def test_equals_looking_back_over_each_hypothesis(self, blocker, twin, seed, start):
        """Random buffers of few tokens (many runs) and a random table of the
        tokens a run may not repeat (word starts, stutter pieces), at every
        step: the tokens blocked are those that the twin finds ending a run
        over the generated tokens; the start token, even one that the table
        names, is not one of them."""
        rng = np.random.default_rng(seed)
        rows, columns, vocab = 9, 18, 5
        blocked = 0
        for trial in range(4):
            table = rng.random(vocab) < 0.6
            ids = rng.integers(0, 2 + trial % 2, size=(rows, columns)).astype("int32")
            ids[:, 0] = 4 if start == "other" else int(np.flatnonzero(table)[0])
            for step in range(columns):
                buffer = ids.copy()
                buffer[:, step + 1:] = 0  # padding after the last written column
                mask = beam_candidates.blocked_mask(vocab, blocker(
                    tf.constant(buffer), tf.constant(step), tf.constant(table))).numpy()
                for row in range(rows):
                    generated = list(buffer[row, 1:step + 1])
                    expected = [-np.inf if twin(generated + [token], table) else 0.0
                                for token in range(vocab)]
                    np.testing.assert_array_equal(mask[row], expected,
                                                  err_msg=f"{trial=} {step=} {row=}")
                blocked += np.isinf(mask).sum()
        assert blocked > 100


class TestLeavingTheBatch:
    def test_equals_the_search_that_keeps_every_example(self):
        """Eight examples of different limits, in a graph of unknown batch size
        (as served): the batch shrinks inside the loop, the cache rows move
        with their examples (`check_path`), the outputs go back in order."""
        model = _PrefixModel(seed=7, batch_size=8)
        beam_size = 3
        limits = tf.constant([1, 4, 2, 4, 3, 1, 2, 4])
        starts = tf.constant([_R_A, _R_B] * 4)

        def search(starts, limits, source, leave):
            return decoding.beam_search(
                model.cached_fn(check_path=True), starts, model.cached_state(source),
                vocab_size=_VOCAB, max_output_length=_MAX_LENGTH, eos_id=_R_EOS,
                beam_size=beam_size, alpha=0.6, max_output_lengths=limits,
                select_examples=_select_tiled(beam_size) if leave else None)

        specs = [tf.TensorSpec([None], tf.int32), tf.TensorSpec([None], tf.int32),
                 tf.TensorSpec([None, _VOCAB], tf.float32)]
        leaving = tf.function(lambda *args: search(*args, True), input_signature=specs)
        ids, scores = _numpy(leaving(starts, limits, tf.constant(model.source)))
        expected_ids, expected_scores = _numpy(
            search(starts, limits, tf.constant(model.source), False))
        np.testing.assert_array_equal(ids, expected_ids)
        np.testing.assert_allclose(scores, expected_scores, rtol=1e-6)
        assert np.isfinite(scores[:, 0]).all()


class TestBestExtensions:
    """The block-wise selection of the beam's candidates against `np.argsort`
    over the whole table of log P(hypothesis) + log_softmax(logits)."""

    @pytest.mark.parametrize("dead_beams", [0, 2])
    def test_equals_sorting_the_whole_table(self, dead_beams):
        rng = np.random.default_rng(dead_beams)
        batch, beams, vocab, k = 5, 3, 60, 6
        # Small integers: many ties, within a block and across blocks and beams.
        logits = rng.integers(-3, 4, size=(batch * beams, vocab)).astype("float32")
        logits[:, 7] = -np.inf  # a token the model rules out
        alive = rng.integers(-4, 0, size=(batch, beams)).astype("float32")
        alive[:, beams - dead_beams:] = -np.inf  # beams without a hypothesis
        table = alive[:, :, None] + (
            logits - np.log(np.exp(logits).sum(-1, keepdims=True))).reshape(batch, beams, vocab)
        table = table.reshape(batch, beams * vocab)
        expected = np.argsort(-table, axis=1, kind="stable")[:, :k]  # ties: lower index first
        for block_size in (4, 10, None):
            values, indices = beam_candidates.best_extensions(
                tf.constant(logits), tf.constant(alive), k, block_size)
            np.testing.assert_array_equal(indices, expected)
            np.testing.assert_allclose(values, np.take_along_axis(table, expected, 1), rtol=1e-6)

    def test_blocked_tokens_are_left_out_and_the_others_keep_their_probabilities(self):
        rng = np.random.default_rng(3)
        batch, beams, vocab, k = 4, 3, 60, 6
        logits = rng.normal(0, 2, size=(batch * beams, vocab)).astype("float32")
        alive = rng.normal(-2, 1, size=(batch, beams)).astype("float32")
        mask = np.where(rng.random((batch * beams, vocab)) < 0.3, -np.inf, 0.0)
        mask[:, np.argmax(logits, axis=1)] = -np.inf  # each row's best token among them
        mask = mask.astype("float32")
        # Blocked after the log-softmax: no renormalization over the others.
        log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        table = (alive[:, :, None] + (log_probs + mask).reshape(batch, beams, vocab)).reshape(
            batch, beams * vocab)
        expected = np.argsort(-table, axis=1, kind="stable")[:, :k]
        for block_size in (4, 10, None):
            values, indices = beam_candidates.best_extensions(
                tf.constant(logits), tf.constant(alive), k, block_size, tf.constant(mask))
            np.testing.assert_array_equal(indices, expected)
            np.testing.assert_allclose(values, np.take_along_axis(table, expected, 1), rtol=1e-5)

    def test_log_normalizers_equal_logsumexp_where_other_probabilities_underflow(self):
        """log Z from the largest logit's softmax probability, against float64."""
        rng = np.random.default_rng(7)
        vocab, block = 1000, 125
        logits = rng.normal(0, 3, size=(6, vocab))
        logits[1] = 0.0  # all equal: Z = V
        logits[2, 5] = 80.0  # every other probability underflows float32's softmax
        logits[3, -1] = 80.0  # the largest in the last block, at its last entry
        logits[4, ::2] = -np.inf  # tokens ruled out
        logits[5] *= 30  # a wide range
        expected = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
        logits = tf.constant(logits, tf.float32)
        blocks = tf.reshape(logits, [6, vocab // block, block])
        log_z = beam_candidates._log_normalizers(logits, blocks, tf.reduce_max(blocks, -1))
        np.testing.assert_allclose(log_z, expected, rtol=0, atol=2e-5)
        np.testing.assert_allclose(log_z[1], np.log(vocab), rtol=1e-6)

    def test_block_size_divides_the_vocabulary_into_enough_blocks(self):
        assert beam_candidates.block_size(37000, 8) == 125
        assert beam_candidates.block_size(32000, 8) == 128
        assert beam_candidates.block_size(32003, 8) is None  # prime: the whole table is sorted
        assert beam_candidates.block_size(200, 8) is None  # 32 is the smallest block: 6 blocks


class TestCompiled:
    """tf.function with and without XLA gives the eager result, traced once."""

    _INPUTS = [
        ([_R_A, _R_B, _R_A], [4, 2, 3], 0),
        ([_R_B, _R_B, _R_A], [3, 4, 1], 1),
    ]

    def _check(self, search):
        graph = tf.function(search)
        compiled = tf.function(search, jit_compile=True)
        # An unknown batch size, as in an exported serving signature (no XLA).
        any_batch = tf.function(
            search,
            input_signature=[
                tf.TensorSpec([None], tf.int32),
                tf.TensorSpec([None], tf.int32),
                tf.TensorSpec([None, _VOCAB], tf.float32),
            ],
        )
        functions = (graph, compiled, any_batch)
        for starts, limits, seed in self._INPUTS:
            source = np.random.default_rng(seed).normal(size=(3, _VOCAB)).astype(np.float32)
            args = (tf.constant(starts), tf.constant(limits), tf.constant(source))
            eager = _numpy(search(*args))
            for function in functions:
                ids, scores = _numpy(function(*args))
                np.testing.assert_array_equal(ids, eager[0])
                np.testing.assert_allclose(scores, eager[1], rtol=1e-5)
        # One program per shape: new values of the same shapes do not retrace.
        for function in functions:
            assert function.experimental_get_tracing_count() == 1

    def test_beam_search(self):
        model = _PrefixModel(seed=4, batch_size=3)

        def search(starts, limits, source):
            return decoding.beam_search(
                model.cached_fn(), starts, model.cached_state(source), vocab_size=_VOCAB,
                max_output_length=_MAX_LENGTH, eos_id=_R_EOS, beam_size=3,
                max_output_lengths=limits,
            )

        self._check(search)

    @pytest.mark.parametrize("size", [0, 1, 2])
    def test_beam_search_blocking_repeated_ngrams(self, size):
        """A request's setting (a tensor: `tf.cond` inside the loop) gives what
        a Python int gives."""
        model = _PrefixModel(seed=4, batch_size=3)

        def search(starts, limits, source, size=tf.constant(size)):
            return decoding.beam_search(
                model.cached_fn(), starts, model.cached_state(source), vocab_size=_VOCAB,
                max_output_length=_MAX_LENGTH, eos_id=_R_EOS, beam_size=2,
                max_output_lengths=limits, no_repeat_ngram_size=size,
            )

        self._check(search)
        starts, limits, seed = self._INPUTS[0]
        source = np.random.default_rng(seed).normal(size=(3, _VOCAB)).astype(np.float32)
        args = (tf.constant(starts), tf.constant(limits), tf.constant(source))
        for expected, found in zip(_numpy(search(*args, size=size)), _numpy(search(*args))):
            np.testing.assert_array_equal(found, expected)

    def test_greedy_search(self):
        model = _PrefixModel(seed=5, batch_size=3)

        def search(starts, limits, source):
            return decoding.greedy_search(
                model.cached_fn(), starts, model.cached_state(source),
                max_output_length=_MAX_LENGTH, eos_id=_R_EOS, max_output_lengths=limits,
            )

        self._check(search)


class TestErrors:
    def test_bad_arguments_say_what_was_received(self):
        fn = _markov_fn([])
        starts = tf.constant([BOS])
        with pytest.raises(ValueError, match="Received: beam_size=0"):
            decoding.beam_search(
                fn, starts, {}, vocab_size=5, max_output_length=3, eos_id=EOS, beam_size=0
            )
        with pytest.raises(ValueError, match="Received: max_output_length=0"):
            decoding.greedy_search(fn, starts, {}, max_output_length=0, eos_id=EOS)
        with pytest.raises(ValueError, match="vocab_size=7"):
            decoding.beam_search(fn, starts, {}, vocab_size=7, max_output_length=3, eos_id=EOS)
        with pytest.raises(ValueError, match="Received: no_repeat_ngram_size=-1"):
            decoding.beam_search(fn, starts, {}, vocab_size=5, max_output_length=3, eos_id=EOS,
                                 no_repeat_ngram_size=-1)
        with pytest.raises(ValueError, match="initial_ids must be a vector"):
            decoding.greedy_search(fn, tf.constant([[BOS]]), {}, max_output_length=3, eos_id=EOS)
