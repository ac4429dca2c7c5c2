python benchmarks/recipe_curves.py --out-dir /tmp/rc/zen4
