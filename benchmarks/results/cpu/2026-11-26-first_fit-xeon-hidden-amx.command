python benchmarks/first_fit.py
