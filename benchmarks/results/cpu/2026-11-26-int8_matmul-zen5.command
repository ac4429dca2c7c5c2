python benchmarks/int8_matmul.py
