"""The paper's comparisons and analyses, apart from the product: `compare` (the four arms, on the embedded task or a
recipe), `relay`, `positions` and `probe-cuts`, with their statistics. `ts_trl/__main__.py` dispatches to them; the
research records they produced live in `research/`."""
