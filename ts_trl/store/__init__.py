"""The seed store: the bank of earlier rollouts, the seed dataset's format on disk, snapshots, resume, the Hub and cards.

Owns every file a run writes under `<output_dir>/seeds` and what it reads back (its own shards and a `seed_dataset`),
the in-memory `SeedBank`, background pushes to the Hub, and the model and dataset cards. Imports `ts_trl.method`
only; the trainer hands it small settings types, never the whole config.
"""
