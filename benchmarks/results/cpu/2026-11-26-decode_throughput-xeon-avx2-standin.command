ONEDNN_MAX_CPU_ISA=AVX2 CT2_FORCE_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 python benchmarks/decode_throughput.py --variants graph --compare-ctranslate2 --repeats 3 --no-profile
