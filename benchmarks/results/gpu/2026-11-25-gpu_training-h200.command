python3 benchmarks/gpu_training.py --cold-seconds 200 --warm-seconds 100 --log-dir $OUT --work-dir /tmp/gpu_training
