"""Train with Thinking Seeds: `accelerate launch [--config_file accelerate_configs/X.yaml] train.py [--config recipe]`.

With no model and no dataset it runs the embedded default: the built-in task and a tiny model, offline on CPU, with
a report of held-out pass@1 before and after. This is the recipe; the steps are `ts_trl.script.main` (also installed
as `ts_trl train`, and `accelerate launch -m ts_trl train`).
"""

from ts_trl.script import fail_clearly, main, make_parser, parse_args

if __name__ == "__main__":
    with fail_clearly():  # bad input: one `train.py: error: ...` line and exit status 2, before any training
        script_args, training_args, model_args = parse_args(make_parser())
    raise SystemExit(main(script_args, training_args, model_args))
