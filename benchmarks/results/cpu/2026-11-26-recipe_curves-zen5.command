python benchmarks/recipe_curves.py --out-dir /tmp/curves/zen5
