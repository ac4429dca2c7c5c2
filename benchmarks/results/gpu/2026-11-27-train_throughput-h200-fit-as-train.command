STEP_SECONDS=0 COLD_SECONDS=0 FIT_SECONDS=270 bash benchmarks/gpu_session.sh  # at 3ef547d, the machine of 2026-11-27-allreduce-h200-xla (the fit split's fit_overhead.json, with the as_train twin)
