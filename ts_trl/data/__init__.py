"""Training data: loaders of local files and Hub datasets from public math and code schemas (`loaders`), and which
columns hold the prompts and the references, without `datasets` (`columns`). Imports `ts_trl.store.schema` only."""
