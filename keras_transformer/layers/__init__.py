"""Keras layers of the Transformer; never imports the model or data. Keras only, but
for _matmul.py, the matrix multiply behind `Projection` (its kernel gradient under XLA
on a CPU, and its transposed kernels in a search, are TensorFlow's), and _cache.py,
the self-attention cache's buffers, which a search's steps grow and overwrite in
place in a TensorFlow graph."""

from keras_transformer.layers.attention import MultiHeadAttention
from keras_transformer.layers.decoder_layer import TransformerDecoderLayer
from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.embedding import SharedEmbedding
from keras_transformer.layers.encoder_layer import TransformerEncoderLayer
from keras_transformer.layers.feed_forward import PositionwiseFeedForward
from keras_transformer.layers.positional_embedding import LearnedPositionalEmbedding
from keras_transformer.layers.positional_encoding import SinusoidalPositionalEncoding
from keras_transformer.layers.projection import Projection
