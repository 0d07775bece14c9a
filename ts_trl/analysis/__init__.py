"""The analysis commands: `relay`, `positions` and `compare` (one module each; `ts_trl/__main__.py` dispatches to them)."""
