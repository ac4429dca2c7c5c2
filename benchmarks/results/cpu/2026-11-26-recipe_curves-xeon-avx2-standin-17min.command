ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 python benchmarks/recipe_curves.py --minutes 17 --out-dir /tmp/curves/avx2-17
