taskset -c 1 python benchmarks/input_pipeline.py
