"""The Flower app example (see README.md here); launch.py runs it locally."""
