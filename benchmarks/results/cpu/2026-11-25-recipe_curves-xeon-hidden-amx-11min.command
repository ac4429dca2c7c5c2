python benchmarks/recipe_curves.py --minutes 11 --out-dir /tmp/curves/xeon11
