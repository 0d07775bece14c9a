"""The analysis commands: `relay`, `positions` and `compare` (one module each, see `ts_trl.commands`)."""
