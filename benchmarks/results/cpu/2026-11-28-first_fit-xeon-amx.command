python benchmarks/first_fit.py --steps 3  # at e9285ea, the fused Adam update (7f919e7); run 1 of 2 alternating with 2026-11-28-first_fit-xeon-amx-before (run 2: 11.3 s)
