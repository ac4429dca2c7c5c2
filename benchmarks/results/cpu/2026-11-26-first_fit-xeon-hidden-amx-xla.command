python benchmarks/first_fit.py --xla on
