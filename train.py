"""Train with Thinking Seeds: `accelerate launch [--config_file accelerate_configs/X.yaml] train.py [--config recipe]`.

With no model and no dataset it runs the embedded default: the built-in task and a tiny model, offline on CPU, with
a report of held-out pass@1 before and after. This is the recipe; the steps are `ts_trl.cli.train.main` (also installed
as `ts_trl train`, and `accelerate launch -m ts_trl train`).
"""

from ts_trl.trainer.notices import quiet_dependencies

quiet_dependencies()  # a command may quiet its dependencies (a library may not): before TRL or DeepSpeed loads

from ts_trl.cli.refusals import refuse_bad_recipe  # noqa: E402

if __name__ == "__main__":
    refuse_bad_recipe("train.py")  # a missing or broken --config recipe, before TRL is imported

from ts_trl.cli.arguments import make_parser, parse_args  # noqa: E402
from ts_trl.cli.environment import fail_clearly  # noqa: E402
from ts_trl.cli.train import main  # noqa: E402

if __name__ == "__main__":
    with fail_clearly():  # bad input: one `train.py: error: ...` line and exit status 2, before any training
        script_args, training_args, model_args = parse_args(make_parser())
    raise SystemExit(main(script_args, training_args, model_args))
