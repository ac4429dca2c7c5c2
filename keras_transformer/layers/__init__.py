"""Keras layers of the Transformer; never imports the model or data. Keras only, but
for matmul.py, the matrix multiply behind `Projection` (its kernel gradient under XLA
on a CPU, and its transposed kernels in a search, are TensorFlow's), and kv_cache.py,
the self-attention cache's layout and writes, which a search's steps may make in place
in a TensorFlow graph. `SearchOptions` says how a search's steps run; the decoder's
layers take it as an argument."""

from keras_transformer.layers.attention import MultiHeadAttention
from keras_transformer.layers.decoder_layer import TransformerDecoderLayer
from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.embedding import SharedEmbedding
from keras_transformer.layers.encoder_layer import TransformerEncoderLayer
from keras_transformer.layers.feed_forward import PositionwiseFeedForward
from keras_transformer.layers.positional_embedding import LearnedPositionalEmbedding
from keras_transformer.layers.positional_encoding import SinusoidalPositionalEncoding
from keras_transformer.layers.projection import Projection
from keras_transformer.layers.search_options import SearchOptions
