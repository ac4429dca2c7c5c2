python benchmarks/int8_matmul.py --rows 128
