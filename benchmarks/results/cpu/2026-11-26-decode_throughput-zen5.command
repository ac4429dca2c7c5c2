python benchmarks/decode_throughput.py --variants graph --precisions float32,bfloat16 --compare-ctranslate2 --repeats 3
