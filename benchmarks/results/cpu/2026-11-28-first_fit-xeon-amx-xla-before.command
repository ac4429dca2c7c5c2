python benchmarks/first_fit.py --xla on --steps 3  # at c5cd971's package (git worktree) with e9285ea's first_fit.py, before the fused Adam update; run just before 2026-11-28-first_fit-xeon-amx-xla
