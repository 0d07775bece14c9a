"""The method's pure logic: where to cut a seed, which groups to seed, prefix masks and importance weights.

Nothing here knows about TRL, files or processes: NumPy and tensor functions over plain values, unit-tested with
hand-computed numbers. Everything above (the seed store, the trainer) calls into it.
"""
