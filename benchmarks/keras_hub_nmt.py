"""The keras.io example "English-to-Spanish translation with KerasHub", as published.

The example (Abheesht Sharma, 2022, last modified 2024/04/30; keras-io
`examples/nlp/neural_machine_translation_with_keras_hub.py`), rewritten as
functions over a list of sentence pairs so that `quality_per_compute.py` can
train it on any corpus for a CPU-time budget and score its translations:

- text lowercased, source and target alike, before anything else;
- one WordPiece vocabulary per language, 15000 tokens asked of
  `keras_hub.tokenizers.compute_word_piece_vocabulary` with the reserved
  tokens [PAD] [UNK] [START] [END]; `WordPieceTokenizer(lowercase=False)`;
- batches of 64 pairs; the source packed to 40 ids (`StartEndPacker`, no
  start or end token), the target to 41 with [START] and [END], decoder
  inputs its first 40 and labels its last 40; batched before tokenizing,
  then `shuffle(2048).prefetch(16).cache()`, in the example's order;
- `TokenAndPositionEmbedding` (vocabulary 15000, length 40, width 256, no
  `mask_zero`), one `TransformerEncoder` and one `TransformerDecoder`
  (intermediate 2048, 8 heads, their default dropout 0), `Dropout(0.5)` and
  `Dense(15000, activation="softmax")`;
- rmsprop, sparse_categorical_crossentropy, accuracy, the dev pairs as
  validation data. Like the example, nothing masks padding: the [PAD]
  positions are attended to and are labels of the loss;
- greedy decoding with `keras_hub.samplers.GreedySampler` over a prompt of
  [START] and 39 [PAD], stopping at [END]; the output is detokenized and
  "[PAD]", "[START]" and "[END]" are removed.

What differs from the published code, and why:
- The split and its shuffle: the example shuffles its one file of pairs and
  cuts it 70/15/15; here the corpus's own train/dev/test splits are used, the
  training pairs shuffled (seeded) as the example's are.
- Seeds: `keras.utils.set_random_seed(seed)` for reproducible runs (the
  example seeds nothing).
- Training length: until a CPU-time budget is spent (`CpuBudget`), not a
  number of epochs; verbose=0. The validation at the end of each epoch is
  run by `CpuBudget` rather than by `fit`, so that none runs once the budget
  has stopped training.
- Detokenizing: the sampler returns float ids (the dtype of the prompt that
  `ops.full` makes), which keras-hub 0.32's eager detokenizer rejects; they
  are cast to int32 first. The output layer has 15000 classes while the
  computed vocabulary can be smaller (4311 English and 5825 Spanish tokens
  on the bundled corpus); an id past the vocabulary, which a model early in
  training can predict, raises an IndexError in the eager detokenizer and
  crashes (segfaults) TensorFlow Text's, so it is detokenized as [UNK].
- Decoding sources longer than 40 tokens: the example's `decode_sequences`
  pads short sources to 40 but leaves longer ones as they are, which fails
  in the 40-row position embedding; here they are cut to their first 40
  tokens, as its `StartEndPacker` cuts training sources.
- Decoding speed, not results (`Translator.translate`): a batch of sentences
  at once, the encoder run once per batch rather than at every step, and the
  output layer applied only at the position being predicted, in one
  `tf.function`. Without padding masks each row of a batch is computed
  independently of the others, the output layer works position by
  position, and tokens after a row's first [END] (which the batched loop
  goes on generating until all rows are done) are set to [PAD], as the
  example's one-sentence loop leaves them; so the outputs are the
  example's. `Translator.translate_reference` is the example's
  `decode_sequences` (one sentence, the whole model at every step, the
  tokenizer run eagerly), and `quality_per_compute.py` checks that both
  agree on the first test sentences.
"""

import os
import random
import time

import keras
import keras_hub
import numpy as np
import tensorflow as tf
from keras import ops

BATCH_SIZE = 64
MAX_SEQUENCE_LENGTH = 40
SOURCE_VOCAB_SIZE = 15000  # the example's ENG_VOCAB_SIZE
TARGET_VOCAB_SIZE = 15000  # the example's SPA_VOCAB_SIZE
EMBED_DIM = 256
INTERMEDIATE_DIM = 2048
NUM_HEADS = 8
RESERVED_TOKENS = ["[PAD]", "[UNK]", "[START]", "[END]"]
OPTIMIZER = "rmsprop"
LOSS = "sparse_categorical_crossentropy"
OUTPUT_DROPOUT = 0.5


def hyperparameters():
    """The example's settings, as a JSON-ready dict."""
    return {
        "batch_size": BATCH_SIZE,
        "max_sequence_length": MAX_SEQUENCE_LENGTH,
        "source_vocab_size": SOURCE_VOCAB_SIZE,
        "target_vocab_size": TARGET_VOCAB_SIZE,
        "embed_dim": EMBED_DIM,
        "intermediate_dim": INTERMEDIATE_DIM,
        "num_heads": NUM_HEADS,
        "encoder_layers": 1,
        "decoder_layers": 1,
        "output_dropout": OUTPUT_DROPOUT,
        "optimizer": OPTIMIZER,
        "loss": LOSS,
        "reserved_tokens": RESERVED_TOKENS,
        "lowercase": True,
        "decoding": "greedy (keras_hub.samplers.GreedySampler)",
    }


def lowercase(pairs):
    """The example lowercases both sides of every pair as it reads them."""
    return [(source.lower(), target.lower()) for source, target in pairs]


def train_word_piece(text_samples, vocab_size, reserved_tokens=RESERVED_TOKENS):
    """A WordPiece vocabulary (a list of strings), as the example computes it."""
    word_piece_ds = tf.data.Dataset.from_tensor_slices(text_samples)
    return keras_hub.tokenizers.compute_word_piece_vocabulary(
        word_piece_ds.batch(1000).prefetch(2),
        vocabulary_size=vocab_size,
        reserved_tokens=reserved_tokens,
    )


def make_tokenizers(source_vocab, target_vocab):
    return (keras_hub.tokenizers.WordPieceTokenizer(vocabulary=source_vocab, lowercase=False),
            keras_hub.tokenizers.WordPieceTokenizer(vocabulary=target_vocab, lowercase=False))


def make_dataset(pairs, source_tokenizer, target_tokenizer):
    """Batches of `({"encoder_inputs", "decoder_inputs"}, labels)`, each (64, 40)."""
    source_packer = keras_hub.layers.StartEndPacker(
        sequence_length=MAX_SEQUENCE_LENGTH,
        pad_value=source_tokenizer.token_to_id("[PAD]"),
    )
    target_packer = keras_hub.layers.StartEndPacker(
        sequence_length=MAX_SEQUENCE_LENGTH + 1,
        start_value=target_tokenizer.token_to_id("[START]"),
        end_value=target_tokenizer.token_to_id("[END]"),
        pad_value=target_tokenizer.token_to_id("[PAD]"),
    )

    def preprocess_batch(source, target):
        source = source_packer(source_tokenizer(source))
        target = target_packer(target_tokenizer(target))  # (B, 41)
        return {"encoder_inputs": source, "decoder_inputs": target[:, :-1]}, target[:, 1:]

    sources, targets = zip(*pairs)
    dataset = tf.data.Dataset.from_tensor_slices((list(sources), list(targets)))
    dataset = dataset.batch(BATCH_SIZE)
    dataset = dataset.map(preprocess_batch, num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.shuffle(2048).prefetch(16).cache()


class Seq2SeqModel:
    """The example's models: `transformer` ([encoder_inputs, decoder_inputs] ->
    next-token probabilities, the one trained), and the parts it is built from,
    which share its layers: `encoder` (source ids -> (B, S, 256)) and
    `decoder_hidden` ([decoder ids, encoder outputs] -> the (B, T, 256) input
    of `output_layer`, the softmax Dense)."""

    def __init__(self, source_vocab_size=SOURCE_VOCAB_SIZE, target_vocab_size=TARGET_VOCAB_SIZE):
        encoder_inputs = keras.Input(shape=(None,), name="encoder_inputs")
        x = keras_hub.layers.TokenAndPositionEmbedding(
            vocabulary_size=source_vocab_size,
            sequence_length=MAX_SEQUENCE_LENGTH,
            embedding_dim=EMBED_DIM,
        )(encoder_inputs)
        encoder_outputs = keras_hub.layers.TransformerEncoder(
            intermediate_dim=INTERMEDIATE_DIM, num_heads=NUM_HEADS
        )(inputs=x)
        self.encoder = keras.Model(encoder_inputs, encoder_outputs)

        decoder_inputs = keras.Input(shape=(None,), name="decoder_inputs")
        encoded_seq_inputs = keras.Input(shape=(None, EMBED_DIM), name="decoder_state_inputs")
        x = keras_hub.layers.TokenAndPositionEmbedding(
            vocabulary_size=target_vocab_size,
            sequence_length=MAX_SEQUENCE_LENGTH,
            embedding_dim=EMBED_DIM,
        )(decoder_inputs)
        x = keras_hub.layers.TransformerDecoder(
            intermediate_dim=INTERMEDIATE_DIM, num_heads=NUM_HEADS
        )(decoder_sequence=x, encoder_sequence=encoded_seq_inputs)
        x = keras.layers.Dropout(OUTPUT_DROPOUT)(x)
        self.decoder_hidden = keras.Model([decoder_inputs, encoded_seq_inputs], x)
        self.output_layer = keras.layers.Dense(target_vocab_size, activation="softmax")
        decoder = keras.Model([decoder_inputs, encoded_seq_inputs], self.output_layer(x))
        decoder_outputs = decoder([decoder_inputs, encoder_outputs])
        self.transformer = keras.Model(
            [encoder_inputs, decoder_inputs], decoder_outputs, name="transformer"
        )


def postprocess(text):
    """The example's clean-up of a detokenized output."""
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    return text.replace("[PAD]", "").replace("[START]", "").replace("[END]", "").strip()


class Translator:
    """Greedy translation with a trained `Seq2SeqModel`, as the example decodes.

    Args:
        model: the `Seq2SeqModel`.
        source_tokenizer, target_tokenizer: its `WordPieceTokenizer`s.
    """

    def __init__(self, model, source_tokenizer, target_tokenizer):
        self.model = model
        self.source_tokenizer = source_tokenizer
        self.target_tokenizer = target_tokenizer
        self.start_id = target_tokenizer.token_to_id("[START]")
        self.end_id = target_tokenizer.token_to_id("[END]")
        self.pad_id = target_tokenizer.token_to_id("[PAD]")
        # In tf.functions the tokenizers run as the tf.data pipeline of
        # training runs them (TensorFlow Text ops; eagerly, keras-hub 0.32
        # runs a Python twin).
        self._generate = tf.function(self._generate_batch, reduce_retracing=True)
        self._detokenize = tf.function(target_tokenizer.detokenize, reduce_retracing=True)

    def _generate_batch(self, sentences):
        tokens = self.source_tokenizer(sentences)[:, :MAX_SEQUENCE_LENGTH]  # ragged (B, None)
        source_ids = tokens.to_tensor(0, shape=[None, MAX_SEQUENCE_LENGTH])  # 0 is [PAD]
        encoded = self.model.encoder(source_ids, training=False)  # (B, 40, 256)

        def next(prompt, cache, index):
            hidden = self.model.decoder_hidden([prompt, encoded], training=False)  # (B, 40, 256)
            probabilities = self.model.output_layer(hidden[:, index - 1, :])  # (B, V)
            return probabilities, None, cache

        batch_size = ops.shape(source_ids)[0]
        start = ops.full((batch_size, 1), self.start_id)
        pad = ops.full((batch_size, MAX_SEQUENCE_LENGTH - 1), self.pad_id)
        prompt = ops.concatenate((start, pad), axis=-1)
        return keras_hub.samplers.GreedySampler()(
            next, prompt, stop_token_ids=[self.end_id], index=1
        )

    def translate(self, sentences, batch_size=BATCH_SIZE):
        """Translations (str) of `sentences` (already lowercased, as the example's are)."""
        translations = []
        for begin in range(0, len(sentences), batch_size):
            batch = tf.constant(sentences[begin:begin + batch_size], tf.string)
            # (B, 40); float32 like the example's prompt (keras.ops.full's default).
            generated = self._generate(batch).numpy().astype("int32")
            # The example's loop (one sentence) stops at [END], leaving [PAD] after it.
            ended = np.cumsum(generated[:, 1:] == self.end_id, axis=1) > 0  # (B, 39)
            after_end = np.concatenate(
                [np.zeros_like(ended[:, :1]), ended[:, :-1]], axis=1)  # strictly after [END]
            generated[:, 1:][after_end] = self.pad_id
            texts = self._detokenize(tf.constant(self._in_vocabulary(generated))).numpy()
            translations += [postprocess(text) for text in texts]
        return translations

    def translate_reference(self, sentence):
        """The example's `decode_sequences` and post-processing, for one sentence:
        the whole model runs at every step (sources cut to 40 tokens, see the
        module docstring)."""
        transformer = self.model.transformer
        batch_size = 1
        encoder_input_tokens = ops.convert_to_tensor(
            self.source_tokenizer([sentence]), sparse=False, ragged=False
        )
        encoder_input_tokens = encoder_input_tokens[:, :MAX_SEQUENCE_LENGTH]  # not in the example
        if ops.shape(encoder_input_tokens)[1] < MAX_SEQUENCE_LENGTH:
            pads = ops.zeros(
                (1, MAX_SEQUENCE_LENGTH - ops.shape(encoder_input_tokens)[1]),
                dtype=encoder_input_tokens.dtype,
            )
            encoder_input_tokens = ops.concatenate([encoder_input_tokens, pads], 1)

        def next(prompt, cache, index):
            logits = transformer([encoder_input_tokens, prompt])[:, index - 1, :]
            hidden_states = None
            return logits, hidden_states, cache

        length = 40
        start = ops.full((batch_size, 1), self.start_id)
        pad = ops.full((batch_size, length - 1), self.pad_id)
        prompt = ops.concatenate((start, pad), axis=-1)
        generated_tokens = keras_hub.samplers.GreedySampler()(
            next, prompt, stop_token_ids=[self.end_id], index=1,
        )
        # Float ids (the prompt's dtype) fail in keras-hub 0.32's eager detokenize.
        generated_tokens = ops.convert_to_numpy(generated_tokens).astype("int32")
        generated_tokens = self._in_vocabulary(generated_tokens)
        return postprocess(self.target_tokenizer.detokenize(generated_tokens)[0])

    def _in_vocabulary(self, ids):
        """`ids` with those past the vocabulary replaced by [UNK]'s."""
        size = self.target_tokenizer.vocabulary_size()
        return np.where(ids < size, ids, self.target_tokenizer.token_to_id("[UNK]"))


class CpuBudget(keras.callbacks.Callback):
    """Stops training at the end of the first batch after which the process's
    CPU time (`time.process_time()`: every thread, since the process started)
    is at least `cpu_seconds`; saves the weights at that point and when the CPU
    time first passes each of `fractions` of the budget.

    It also runs the example's validation at the end of each epoch (what
    `fit(validation_data=...)` does), except after the budget has stopped
    training, where `fit` would run one more.

    Attributes:
        points: `[{"cpu_seconds", "steps", "weights"}]`, one per saved weights
            file, in order; the last is where training stopped.
        checked_before_stop: the CPU time at the batch end before the last
            point's, the last check that found the budget unspent.
    """

    def __init__(self, cpu_seconds, directory, fractions=(0.25, 0.5, 0.75),
                 validation_data=None, log=None):
        super().__init__()
        self.cpu_seconds = cpu_seconds
        self.directory = directory
        self.pending = sorted(f * cpu_seconds for f in fractions if 0 < f < 1)
        self.validation_data = validation_data
        self.log = log or (lambda message: None)
        self.points = []
        self.checked_before_stop = None
        self._last_check = None

    def on_epoch_end(self, epoch, logs=None):
        if self.model.stop_training:
            return
        message = f"epoch {epoch + 1}: loss {logs['loss']:.3f}" if logs else f"epoch {epoch + 1}"
        if self.validation_data is not None:
            scores = self.model.evaluate(self.validation_data, verbose=0, return_dict=True)
            message += f", val_loss {scores['loss']:.3f}"
        self.log(f"{message}, {time.process_time():.1f} CPU-seconds")

    def on_train_batch_end(self, batch, logs=None):
        now = time.process_time()
        done = now >= self.cpu_seconds
        if done:
            self.checked_before_stop = self._last_check
        self._last_check = now
        passed = [t for t in self.pending if now >= t]
        self.pending = self.pending[len(passed):]
        if not (done or passed):
            return
        steps = int(self.model.optimizer.iterations.numpy())
        if self.points and self.points[-1]["steps"] == steps:
            self.points.pop()
        path = os.path.join(self.directory, f"weights-{steps:08d}.weights.h5")
        self.model.save_weights(path)
        self.points.append({"cpu_seconds": now, "steps": steps, "weights": path})
        self.log(f"step {steps}, {now:.1f} CPU-seconds: saved {path}")
        if done:
            self.model.stop_training = True


def train(train_pairs, dev_pairs, cpu_seconds, directory, *, fractions=(0.25, 0.5, 0.75),
          seed=0, log=None):
    """Trains the example's model until the process has used `cpu_seconds`.

    Everything that the example does before and during `fit` counts: the
    vocabularies, the datasets, the model, and training with validation at
    the end of each epoch.

    Args:
        train_pairs, dev_pairs: lists of (source, target) strings, cased (they
            are lowercased here).
        cpu_seconds: the budget, in process CPU seconds.
        directory: where the vocabularies and the weights go.
        fractions: fractions of the budget at which weights are saved too.
        seed: shuffles the training pairs; seeds weights and dropout.
        log: a function taking a progress message.

    Returns:
        `(translator, budget)`: a `Translator` over the trained model and its
        tokenizers, and the `CpuBudget` (its `points` and `checked_before_stop`).
    """
    log = log or (lambda message: None)
    os.makedirs(directory, exist_ok=True)
    keras.utils.set_random_seed(seed)
    train_pairs = lowercase(train_pairs)
    random.Random(seed).shuffle(train_pairs)  # the example shuffles its pairs before the split
    dev_pairs = lowercase(dev_pairs)

    log("computing the WordPiece vocabularies")
    source_vocab = train_word_piece([p[0] for p in train_pairs], SOURCE_VOCAB_SIZE)
    target_vocab = train_word_piece([p[1] for p in train_pairs], TARGET_VOCAB_SIZE)
    for name, vocab, size in (("source", source_vocab, SOURCE_VOCAB_SIZE),
                              ("target", target_vocab, TARGET_VOCAB_SIZE)):
        if len(vocab) > size:  # ids past the embedding's rows would fail
            raise ValueError(f"the {name} WordPiece vocabulary has {len(vocab)} tokens, more "
                             f"than the {size} rows of the example's embedding")
        with open(os.path.join(directory, f"{name}_vocab.txt"), "w") as f:
            f.write("\n".join(vocab) + "\n")
    source_tokenizer, target_tokenizer = make_tokenizers(source_vocab, target_vocab)
    train_ds = make_dataset(train_pairs, source_tokenizer, target_tokenizer)
    val_ds = make_dataset(dev_pairs, source_tokenizer, target_tokenizer)

    model = Seq2SeqModel()
    model.transformer.compile(OPTIMIZER, loss=LOSS, metrics=["accuracy"])
    budget = CpuBudget(cpu_seconds, directory, fractions, validation_data=val_ds, log=log)
    log(f"training until {cpu_seconds:g} CPU-seconds (now {time.process_time():.1f})")
    # shuffle=False: the dataset comes shuffled (fit ignores shuffle for one, with a warning).
    model.transformer.fit(train_ds, epochs=1_000_000, callbacks=[budget], shuffle=False,
                          verbose=0)
    return Translator(model, source_tokenizer, target_tokenizer), budget
