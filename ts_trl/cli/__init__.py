"""The command line: `ts_trl train` (and `train.py`), its flags, console, interrupts and report.

What a script may do and a library may not lives here: quieting dependencies' notices, setting torch's threads,
handling Ctrl-C and SIGTERM.

Every refusal is one `prog: error: ...` line on stderr and exit status 2 (`environment.fail_clearly`, which prints it
on local rank 0 only), and each has one owner, in the order a command meets them:

- `refusals.py` (`read_recipe`): a `--config` recipe that is missing, not YAML or not a mapping; the only refusal
  made before torch, transformers and TRL are imported (it needs no parser).
- `arguments.py`: what TRL's parser refuses (a value that does not parse, a flag without its value), unknown flags
  (with the nearest known one), recipe keys the parser does not know and recipe values its flags' conversions refuse.
- `arguments.py` (`input_problems`, one sentence for all, by the rules in `refusals.py`): settings of the other kind
  of data, the settings a dataset run lacks, a local data file without a prompt or answer column
  (`ts_trl/data/columns.py` picks them), reward names that name nothing, `--load_in_4bit/8bit` on the tiny model, a
  model that cannot load; then, alone, an output folder that
  holds an earlier run or a checkpoint to resume from that is not one (`environment.check_output_dir`, every rank).
- `SeedGRPOConfig` and TRL's and transformers' dataclasses: their own rules, the seeding settings' among them
  (`method/settings.py`), applied once, when `arguments.parse_args` builds them.
- `train.py` (`fail_clearly` around building the trainer): what needs the libraries (a dataset's rows and columns
  once loaded, what a reward module holds).
"""
