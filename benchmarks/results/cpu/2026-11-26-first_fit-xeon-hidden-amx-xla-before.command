python benchmarks/first_fit.py --xla on  # in a worktree of f54e37c, before MultiWorkerModel built the optimizer's slots ahead of the first trace on one device
