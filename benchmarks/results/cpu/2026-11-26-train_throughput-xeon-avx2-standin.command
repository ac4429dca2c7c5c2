ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 python benchmarks/train_throughput.py --model cpu-small --vocab-size 8000 --precisions float32 --xla off --real-batches bundled
