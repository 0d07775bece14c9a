"""The command line: `ts_trl train` (and `train.py`), its flags, console, data loading, interrupts and report.

What a script may do and a library may not lives here: quieting dependencies' notices, setting torch's threads,
handling Ctrl-C and SIGTERM.
"""
