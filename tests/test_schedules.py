import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import TransformerSchedule
from keras_transformer import transformer_optimizer


def paper_rate(step_num, d_model=512, warmup_steps=4000):
    """Sec. 5.3, with the paper's 1-based step_num."""
    return d_model**-0.5 * min(step_num**-0.5, step_num * warmup_steps**-1.5)


@pytest.mark.parametrize("step_num", [1, 2, 4000, 40000])
def test_schedule_equals_closed_form(step_num):
    schedule = TransformerSchedule(d_model=512, warmup_steps=4000)
    # Keras passes 0-based optimizer iterations.
    np.testing.assert_allclose(float(schedule(step_num - 1)), paper_rate(step_num), rtol=1e-6)


def test_schedule_peak_scale_and_round_trip():
    schedule = TransformerSchedule(d_model=1024, warmup_steps=100, scale=2.0)
    rates = [float(schedule(i)) for i in range(300)]
    assert int(np.argmax(rates)) == 99  # step_num 100
    np.testing.assert_allclose(max(rates), 2.0 * (1024 * 100) ** -0.5, rtol=1e-6)
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    assert clone.get_config() == schedule.get_config()
    with pytest.raises(ValueError, match="warmup_steps=0"):
        TransformerSchedule(512, warmup_steps=0)


def test_optimizer_uses_the_papers_adam_settings():
    optimizer = transformer_optimizer(d_model=512)
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.9, 0.98, 1e-9)
    np.testing.assert_allclose(float(optimizer.learning_rate), paper_rate(1), rtol=1e-6)


def test_schedule_reads_a_variable_warmup_at_every_step():
    """train.py --time-budget plans the warm-up after the train step is traced."""
    warmup = keras.Variable(4000.0, trainable=False)
    schedule = TransformerSchedule(d_model=512, warmup_steps=warmup)
    compiled = tf.function(schedule, jit_compile=True)
    np.testing.assert_allclose(float(compiled(9)), paper_rate(10), rtol=1e-6)
    warmup.assign(50.0)
    for step_num in (10, 50, 400):
        np.testing.assert_allclose(float(compiled(step_num - 1)),
                                   paper_rate(step_num, warmup_steps=50), rtol=1e-6)
    assert schedule.get_config()["warmup_steps"] == 50.0
    with pytest.raises(ValueError, match="warmup_steps=0.0"):
        TransformerSchedule(512, warmup_steps=keras.Variable(0.0, trainable=False))
    scale = keras.Variable(1.0, trainable=False)
    schedule = TransformerSchedule(d_model=512, warmup_steps=100, scale=scale)
    scale.assign(3.0)
    np.testing.assert_allclose(float(schedule(99)), 3.0 * paper_rate(100, warmup_steps=100),
                               rtol=1e-6)
    assert schedule.get_config()["scale"] == 3.0


def update_ops_per_variable(optimizer_class):
    """Graph ops that one more variable adds to a traced update."""
    counts = []
    for n in (4, 5):
        variables = [keras.Variable(np.zeros((3, 2), "float32")) for _ in range(n)]
        optimizer = optimizer_class(learning_rate=1e-3)
        optimizer.build(variables)
        update = tf.function(lambda: optimizer.apply([tf.ones((3, 2))] * n, variables))
        counts.append(len(update.get_concrete_function().graph.get_operations()))
    return counts[1] - counts[0]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf.function"])
def test_adam_makes_keras_adams_updates_with_fewer_ops(compiled):
    """train's Adam makes each variable's update one fused op: the same updates as
    Keras's Adam (the twin; the fused kernel rounds in its own order, a few float32
    ulps a step), from an eighth of the graph ops to trace and convert for XLA."""
    from keras_transformer import optimizers

    rng = np.random.RandomState(0)
    shapes = [(4, 3), (3,), (2, 2, 2)]
    schedule = TransformerSchedule(d_model=16, warmup_steps=3)
    ours = transformer_optimizer(d_model=16, warmup_steps=3)
    twin = keras.optimizers.Adam(schedule, beta_1=0.9, beta_2=0.98, epsilon=1e-9)
    mine = [keras.Variable(rng.randn(*shape).astype("float32")) for shape in shapes]
    reference = [keras.Variable(variable.numpy()) for variable in mine]
    def apply_ours(gradients):
        ours.apply(gradients, mine)

    def apply_twin(gradients):
        twin.apply(gradients, reference)

    if compiled:
        apply_ours, apply_twin = tf.function(apply_ours), tf.function(apply_twin)
    for _ in range(6):
        gradients = [tf.constant(rng.randn(*shape).astype("float32")) for shape in shapes]
        apply_ours(gradients)
        apply_twin(gradients)
        for a, b in zip(mine, reference):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
    assert int(ours.iterations.numpy()) == 6
    assert update_ops_per_variable(optimizers.Adam) <= 0.2 * update_ops_per_variable(
        keras.optimizers.Adam)
