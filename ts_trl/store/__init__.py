"""The seed store: the bank of earlier rollouts, the seed dataset on disk, snapshots, resume, `seed_dataset`, the Hub.

Owns every file a run writes under `<output_dir>/seeds` and what it reads back (its own shards and a `seed_dataset`),
the in-memory `SeedBank`, background pushes to the Hub and the seed dataset's card, on three floors: `files`,
`schema`, `lock`, `checkpoints`, `local_cuts` and `agent_traces` import nothing of the store; `resume`, `format`,
`bank`, `hub`, `dataset_card`, `traces` and `text_seeds` only those; `seed_store` and `external_seeds` put them
together. Imports `ts_trl.method` only; the trainer hands it small settings types, never the whole config nor itself.
"""
