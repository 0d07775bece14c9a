"""Train with Thinking Seeds: `accelerate launch [--config_file accelerate_configs/X.yaml] train.py [--config recipe.yaml]`.

With no model and no dataset it runs the embedded default: the built-in task and a tiny model, offline on CPU, with
a report of held-out pass@1 before and after. All logic lives in `ts_trl.cli`; this file is the recipe.
"""

import logging
import time
import warnings

from trl import get_peft_config

from ts_trl import SeedGRPOTrainer
from ts_trl.cli import (
    SaveOnInterrupt,
    check_columns,
    fail_clearly,
    held_out_pass_at_1,
    is_embedded_task,
    load_model,
    load_training_data,
    make_parser,
    parse_args,
    report_run,
    resolve_rewards,
    write_cards,
)

logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.WARNING)
# TRL 1.16 still calls the transformers 5 names deprecated for v6; the warning repeats at every step.
warnings.filterwarnings("ignore", message=".*deprecated and will be removed in v6", category=FutureWarning)


def main():
    start = time.time()
    with fail_clearly():  # bad input: one line on stderr and exit status 2, before any training
        script_args, training_args, model_args = parse_args(make_parser())
        embedded = is_embedded_task(script_args)
        model, tokenizer = load_model(script_args, training_args, model_args)
        train_dataset, eval_dataset = load_training_data(script_args, training_args)
        reward_funcs = resolve_rewards(script_args.reward_funcs, embedded)
        check_columns(train_dataset, reward_funcs)
        trainer = SeedGRPOTrainer(
            model=model,
            reward_funcs=reward_funcs,
            args=training_args,
            train_dataset=train_dataset,
            eval_dataset=None if embedded else eval_dataset,  # the built-in held-out set is scored below instead
            processing_class=tokenizer,
            peft_config=get_peft_config(model_args),
            callbacks=[SaveOnInterrupt()],  # a Ctrl-C save is a checkpoint like any other, with its seed shard
        )
    trainer.accelerator.print(
        f"Training on {trainer.accelerator.num_processes} process(es), DeepSpeed: {trainer.is_deepspeed_enabled}"
    )

    before = held_out_pass_at_1(trainer, script_args, eval_dataset) if embedded else None
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    after = held_out_pass_at_1(trainer, script_args, eval_dataset) if embedded else None

    trainer.save_model(training_args.output_dir)
    metrics = {"held_out_pass@1_before": before, "held_out_pass@1_after": after} if embedded else {}
    cards = write_cards(trainer, script_args, model_args, {k: v for k, v in metrics.items() if v is not None})
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)

    report_run(trainer, start, metrics, cards)
    trainer.end()


if __name__ == "__main__":
    main()
