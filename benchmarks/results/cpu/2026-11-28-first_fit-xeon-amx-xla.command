python benchmarks/first_fit.py --xla on --steps 3  # at e9285ea, the fused Adam update (7f919e7); run just after 2026-11-28-first_fit-xeon-amx-xla-before
