"""The trainer's model-repo side: the model card, adapter configs that name their base by Hub id, and pushes that keep
the seeds out of the model repo (they go to their own dataset repo) and fail in one line."""

from __future__ import annotations

import os
from pathlib import Path

from ..store.hub import one_line_hub_errors
from .model_card import model_card_for, name_adapter_bases
from .trl_internals import seeds_kept_out_of_model_repo


class ModelRepo:
    """A mixin before `GRPOTrainer`: TRL's save, card and push hooks with this package's card and repo rules."""

    def _save(self, output_dir: str | None = None, state_dict=None):
        # Every save of the model (checkpoints, save_model, push_to_hub) comes here, on the process that writes.
        super()._save(output_dir, state_dict)
        name_adapter_bases(output_dir or self.args.output_dir, self.args.output_dir)  # Hub id, never a local path

    def create_model_card(self, model_name=None, dataset_name=None, tags=None, metrics=None):
        """Writes `README.md` from this package's template (TRL's own template lookup cannot see ours).

        The one writer of the model card: at every checkpoint (TRL calls it from `_save_checkpoint`), from
        `push_to_hub`, and at the end of `ts_trl train` with `metrics` (e.g. held-out pass@1) added to the run means.
        """
        if not self.is_world_process_zero():
            return
        card = model_card_for(self, model_name=model_name, dataset_name=dataset_name, tags=tags, metrics=metrics)
        card.save(os.path.join(self.args.output_dir, "README.md"))

    def init_hf_repo(self, token: str | None = None, private: bool | None = None) -> None:
        repo = self.args.hub_model_id or Path(self.args.output_dir).absolute().name
        with one_line_hub_errors(
            f"create the model repo {repo!r} (push_to_hub)",
            "Check the network, HF_ENDPOINT and `hf auth whoami`, or train without push_to_hub and upload the "
            f"output_dir later with `hf upload {repo} <output_dir> --exclude 'seeds/*'`.",
        ):
            super().init_hf_repo(token=token, private=private)

    def push_to_hub(self, *args, **kwargs):
        with (
            one_line_hub_errors(
                f"push {self.args.output_dir} to the model repo {self.hub_model_id!r}",
                f"The model is saved in {self.args.output_dir}; upload it later with "
                f"`hf upload {self.hub_model_id} {self.args.output_dir} --exclude 'seeds/*'`.",
            ),
            seeds_kept_out_of_model_repo(),
        ):
            return super().push_to_hub(*args, **kwargs)

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        with seeds_kept_out_of_model_repo():
            return super()._push_from_checkpoint(checkpoint_folder)
