"""A no-training Flower app for bench/vs_flower.py (deployment engine)."""
