"""The shared-prefix forward (ts_trl/trainer/shared_prefix.py): the same log-probs, entropies, losses and gradients as
TRL's row-by-row forward, checked on the packed layout, on one forward, and through `trainer.train()`."""

import logging

import pytest
import torch

from tests.conftest import logged
from ts_trl.trainer.shared_prefix import ForwardCost, forward_cost, pack_rows, unpack

TOL = dict(rtol=1e-4, atol=1e-5)
FP32 = dict(bf16=False)  # GRPOConfig's bf16 default runs the forward under CPU bf16 autocast


def _batch(vocab: int, seed: int = 0, prefix: int = 3):
    """Two groups of four rows: group 0 shares `prefix` completion tokens (a seed prefix), group 1 two, under a
    left-padded prompt; two rows end early (right padding)."""
    g = torch.Generator().manual_seed(seed)
    B, P, C = 8, 6, 10
    prompt = torch.randint(3, vocab, (2, P), generator=g).repeat_interleave(4, 0)
    prompt_mask = torch.ones(B, P, dtype=torch.long)
    prompt_mask[4:, :2] = 0
    completion = torch.randint(3, vocab, (B, C), generator=g)
    completion[:4, :prefix] = completion[0, :prefix]
    completion[4:, :2] = completion[4, :2]
    completion_mask = torch.ones(B, C, dtype=torch.long)
    completion_mask[1, 7:] = 0
    completion_mask[5, 4:] = 0
    return torch.cat([prompt, completion], 1), torch.cat([prompt_mask, completion_mask], 1), C


@pytest.mark.parametrize("max_tokens", [None, 0])
def test_pack_rows_computes_each_group_prefix_once(max_tokens):
    """All groups in one sequence (None), or one sequence a group (0), the shorter padded at its end."""
    ids, mask, C = _batch(50)
    packed = pack_rows(ids, mask, C, max_tokens=max_tokens)
    # group 0: 6 prompt + 3 shared; group 1: 4 real prompt + 2 shared; each row: a copy of the last shared token and
    # its own real tokens
    own = [7 + 1, 4 + 1, 7 + 1, 7 + 1, 8 + 1, 2 + 1, 8 + 1, 8 + 1]
    lengths = [9 + sum(own[:4]), 6 + sum(own[4:])]
    assert packed.packed_tokens == sum(lengths)
    assert packed.input_ids.shape == ((1, sum(lengths)) if max_tokens is None else (2, max(lengths)))
    assert packed.calls == ([(0, 1, sum(lengths))] if max_tokens is None else [(0, 2, max(lengths))])  # 36 of 38
    assert packed.unshared_tokens == 8 * 16
    flat = lambda values: values.reshape(-1)  # noqa: E731 (`source` indexes the sequences laid end to end)
    input_ids, positions, labels = flat(packed.input_ids), flat(packed.position_ids), flat(packed.shift_labels)
    # every completion token is predicted by a packed token holding the token before it, at the same position
    for row in range(8):
        for t in range(C):
            index = packed.source[row, t].item()
            if mask[row, 6 + t] == 0:  # scored nothing, as TRL scores it: log-prob 0
                assert index == packed.tokens or labels[index] == -100
                continue
            assert input_ids[index] == ids[row, 5 + t]
            assert positions[index] == 5 + t
            assert labels[index] == ids[row, 6 + t]
    # rows of group 0 read their prefix tokens from the same packed positions
    assert packed.source[0, :3].tolist() == packed.source[3, :3].tolist()
    # a row never sees another row's own tokens, nor another group's, nor padding
    L = packed.input_ids.shape[1]
    visible = torch.block_diag(*packed.visible)  # (S L, S L): no token sees another sequence
    first_own = packed.source[0, 4].item()
    second_own = packed.source[2, 4].item()
    assert not visible[second_own, first_own] and not visible[first_own, second_own]
    assert not visible[packed.source[4, 0], packed.source[0, 0]]
    if max_tokens == 0:  # the shorter sequence's padding (sequences by decreasing length) neither sees nor is seen
        real = (torch.arange(L)[None] < torch.tensor(lengths)[:, None]).reshape(-1)
        assert (~real).sum() == 2 * L - sum(lengths)
        assert not visible[real][:, ~real].any() and not visible[~real][:, real].any()
    scored = torch.arange(packed.tokens).reshape(packed.input_ids.shape).float() * (packed.shift_labels != -100)
    assert unpack(scored, packed)[1, 7:].tolist() == [0.0, 0.0, 0.0]  # as the fused head gives: 0 where unscored


def _embedded_like_batch(groups: int = 32, rows: int = 8, prompt: int = 11, completion: int = 32):
    """The embedded default's micro-batch shape: 32 short prompts x 8 rows, completions of 16-32 characters."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 40, (groups * rows, prompt + completion), generator=g)
    ids[:, :prompt] = ids[::rows, :prompt].repeat_interleave(rows, 0)
    mask = torch.ones_like(ids)
    for row in range(groups * rows):
        mask[row, prompt + torch.randint(16, completion + 1, (1,), generator=g).item() :] = 0
    return ids, mask, completion


def test_the_cost_estimate_packs_group_by_group_where_one_sequence_would_cost_more(tokenizer):
    """The embedded default's model (0.3M parameters) and micro-batch (256 rows): one packed sequence costs more than
    the padded rows (its attention square; 3.4 s a step against 0.85 s when that was the layout), one sequence a group
    (bins of groups) less."""
    from ts_trl.tiny import build_tiny_model

    cost = forward_cost(build_tiny_model(tokenizer, hidden_size=128).config)
    assert cost.per_token > 0 and cost.per_pair > 0
    ids, mask, C = _embedded_like_batch()
    rows = cost.of(*ids.shape)
    one = pack_rows(ids, mask, C)
    assert cost.of(*one.input_ids.shape) > 3 * rows
    chosen = pack_rows(ids, mask, C, cost=cost)
    assert chosen.input_ids.shape[0] > 1 and cost.of(*chosen.input_ids.shape) < rows
    assert chosen.packed_tokens == one.packed_tokens
    # attention free, one sequence is cheapest; every sequence its own group's, the bins reach the longest group
    assert pack_rows(ids, mask, C, cost=ForwardCost(1.0, 0.0)).input_ids.shape[0] == 1
    assert pack_rows(ids, mask, C, max_tokens=0).input_ids.shape[0] == 32


def _long_prompt_batch(seeded: int):
    """The long-prefix setting of docs/performance.md: 2 groups of 8 rows, 200-token prompts, 128-token completions;
    the first `seeded` groups' rows share a 64-token prefix."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 40000, (16, 328), generator=g)
    for group in range(2):
        rows = slice(8 * group, 8 * group + 8)
        ids[rows, :200] = ids[8 * group, :200]
        if group < seeded:
            ids[rows, 200:264] = ids[8 * group, 200:264]
    return ids, torch.ones_like(ids), 128


def test_a_much_shorter_sequence_runs_in_a_call_of_its_own():
    """SmolLM2-135M's sizes: beside a plain group (1232 packed tokens) a seeded one (784) would be padded to 1232, or
    share one sequence of 2016 with it (attention over every pair); in a call of its own it costs neither. Without
    `split_calls` (a distributed model under gradient) the cost estimate picks the one sequence."""
    from transformers import LlamaConfig

    sizes = dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3)
    cost = forward_cost(LlamaConfig(intermediate_size=1536, **sizes))
    ids, mask, C = _long_prompt_batch(seeded=1)
    split = pack_rows(ids, mask, C, cost=cost)
    assert split.calls == [(0, 1, 1232), (1, 2, 784)] and split.input_ids.shape == (2, 1232)
    assert split.tokens == split.packed_tokens == 2016
    joined = pack_rows(ids, mask, C, cost=cost, split_calls=False)
    assert joined.calls == [(0, 1, 2016)]
    assert cost.of_calls(split.calls) < 0.85 * cost.of_calls(joined.calls)
    assert cost.of_calls(joined.calls) < cost.of(2, 1232)  # the padded pair, the other way to make one call
    # sequences of nearly one length share a call: neither seeded, or both
    for seeded, length in ((0, 1232), (2, 784)):
        assert pack_rows(*_long_prompt_batch(seeded), cost=cost).calls == [(0, 2, length)]


def test_pack_rows_refuses_layouts_it_cannot_share_exactly():
    ids, mask, C = _batch(50)
    right_padded_prompt = mask.clone()
    right_padded_prompt[0, 5] = 0
    assert "left-padded" in pack_rows(ids, right_padded_prompt, C)
    gap = mask.clone()
    gap[0, 8] = 0
    assert "after a masked one" in pack_rows(ids, gap, C)


@pytest.mark.parametrize("layout", ["by cost", "one sequence", "two calls"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_one_forward_gives_trl_log_probs_entropies_and_gradients(make_trainer, monkeypatch, attention, layout):
    """The trainer's layout for this batch is one sequence a group (two of 38 and 36 tokens, the shorter padded, in one
    call); with attention priced at nothing, one sequence for both; where group 0 shares 7 of its 10 completion
    tokens, its sequence (26 tokens) runs in a call of its own beside the other (36)."""
    if layout == "one sequence":
        monkeypatch.setattr("ts_trl.trainer.shared_prefix.forward_cost", lambda config: ForwardCost(1.0, 0.0))
    trainer = make_trainer(max_steps=1, seed_fraction=0.0, **FP32)
    model = trainer.model
    model.set_attn_implementation(attention)
    model.train()
    ids, mask, C = _batch(model.config.vocab_size, prefix=8 if layout == "two calls" else 3)
    weights = torch.randn(ids.shape[0], C, generator=torch.Generator().manual_seed(1))
    results = {}
    for shared in (True, False):
        trainer.args.shared_prefix = shared
        model.zero_grad()
        logps, entropies, _ = trainer._get_per_token_logps_and_entropies(model, ids, mask, C, compute_entropy=True)
        (logps * weights).sum().backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters()}
        results[shared] = logps.detach(), entropies, grads
    (shared_logps, shared_entropies, shared_grads), (logps, entropies, grads) = results[True], results[False]
    torch.testing.assert_close(shared_logps, logps, **TOL)
    torch.testing.assert_close(shared_entropies, entropies, **TOL)
    for name, grad in grads.items():
        torch.testing.assert_close(shared_grads[name], grad, **TOL, msg=name)
    computed = {"one sequence": 74, "by cost": 2 * 38, "two calls": 36 + 26}[layout]  # 8 rows of 16 padded
    assert logged_share(trainer) == computed / 128
    if layout == "two calls":
        assert pack_rows(ids, mask, C, cost=forward_cost(model.config)).calls == [(0, 1, 36), (1, 2, 26)]


@pytest.mark.parametrize("checkpointing", ["off", "non-reentrant", "reentrant"])
def test_a_ddp_model_is_called_once_a_micro_batch_under_gradient(make_trainer, tmp_path, monkeypatch, checkpointing):
    """Each rank lays out its own micro-batch and DDP's forward broadcasts the module's buffers, so with gradient the
    packed sequences run in one call, as TRL's rows do, whatever the checkpointing; without gradient (the old and
    reference log-probs) they may split. The gradients are TRL's. A one-process gloo group; DDP looks for unused
    parameters (as transformers sets it up for a PEFT model), except with reentrant checkpointing, which cannot run
    with that."""
    import torch.distributed as dist
    from accelerate import Accelerator
    from accelerate.utils import DistributedType
    from torch.nn.parallel import DistributedDataParallel

    trainer = make_trainer(max_steps=1, seed_fraction=0.0, **FP32)
    model = trainer.model
    if checkpointing != "off":
        model.activation_checkpointing_enable({"use_reentrant": checkpointing == "reentrant"})
    model.train()
    ids, mask, C = _batch(model.config.vocab_size, prefix=8)  # two calls on one process (the test above)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'group'}", rank=0, world_size=1)
    monkeypatch.setattr(Accelerator, "distributed_type", property(lambda self: DistributedType.MULTI_CPU))
    try:
        ddp = DistributedDataParallel(model, find_unused_parameters=checkpointing != "reentrant")
        calls, grads = [], {}
        model.register_forward_hook(lambda module, args, output: calls.append(1))
        with torch.no_grad():
            trainer._get_per_token_logps_and_entropies(ddp, ids, mask, C)
        assert len(calls) == 2
        for shared in (True, False):
            trainer.args.shared_prefix, calls[:] = shared, []
            model.zero_grad()
            logps, _, _ = trainer._get_per_token_logps_and_entropies(ddp, ids, mask, C)
            logps.sum().backward()
            grads[shared] = {name: p.grad.clone() for name, p in model.named_parameters()}
            assert len(calls) == 1
    finally:
        dist.destroy_process_group()
    for name, grad in grads[False].items():
        torch.testing.assert_close(grads[True][name], grad, **TOL, msg=name)


def logged_share(trainer) -> float:
    return trainer._metrics["train"]["shared_prefix/token_share"][-1]


def _train(make_trainer, tmp_path, name, shared, **settings):
    # SGD: Adam scales each coordinate's step by its own gradient's size, so a float-rounding difference in a
    # near-zero gradient coordinate becomes a full-size step; with SGD the parameters differ as the gradients do.
    settings = {"optim": "sgd", "learning_rate": 0.1, **FP32, **settings}
    trainer = make_trainer(shared_prefix=shared, output_dir=str(tmp_path / name), **settings)
    trainer.train()
    return trainer


TRAININGS = {
    "state-seeded": dict(prefix_mode="state"),
    "action-seeded": dict(prefix_mode="action"),
    "plain": dict(seed_fraction=0.0),
    "iterations": dict(num_iterations=2, steps_per_generation=2, per_device_train_batch_size=4),
    "kl": dict(beta=0.1),
    "dapo": dict(loss_type="dapo"),
    "dr_grpo": dict(loss_type="dr_grpo"),
    "bnpo": dict(loss_type="bnpo"),
    "grpo": dict(loss_type="grpo"),
    "sequence-is": dict(importance_sampling_level="sequence", num_iterations=2),
}


@pytest.mark.parametrize("case", list(TRAININGS))
def test_training_with_and_without_sharing_is_the_same(make_trainer, tmp_path, case):
    """Per-step losses and logged metrics and the final parameters agree (fp32) with the switch on and off."""
    settings = {"max_steps": 4, "save_steps": 2, **TRAININGS[case]}
    on = _train(make_trainer, tmp_path, "on", True, **settings)
    off = _train(make_trainer, tmp_path, "off", False, **settings)
    assert logged(on, "shared_prefix/token_share"), "the shared forward never ran"
    assert all(share < 1.0 for share in logged(on, "shared_prefix/token_share"))
    for key in ("loss", "entropy", "rewards/count_reward/mean", "completions/mean_length", "seeds/seeded_group_share"):
        assert logged(on, key) == pytest.approx(logged(off, key), rel=1e-4, abs=1e-6), key
    for (name, a), (_, b) in zip(on.model.named_parameters(), off.model.named_parameters()):
        torch.testing.assert_close(a, b, **TOL, msg=name)


def test_lora_training_with_and_without_sharing_is_the_same(make_trainer, tmp_path):
    from peft import LoraConfig

    from tests.conftest import build_tiny_model, build_tokenizer, count_reward, tiny_prompts
    from ts_trl import SeedGRPOConfig, SeedGRPOTrainer

    trainers = {}
    for shared in (True, False):
        args = SeedGRPOConfig(
            output_dir=str(tmp_path / str(shared)), per_device_train_batch_size=8, num_generations=4,
            max_completion_length=12, max_steps=4, save_steps=2, logging_steps=1, learning_rate=1e-3, report_to=[],
            use_cpu=True, seed=0, seed_fraction=1.0, disable_tqdm=True, shared_prefix=shared, bf16=False,
        )  # fmt: skip
        tokenizer = build_tokenizer()
        trainer = SeedGRPOTrainer(
            model=build_tiny_model(tokenizer), reward_funcs=count_reward, args=args, train_dataset=tiny_prompts(),
            processing_class=tokenizer, peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"]),
        )  # fmt: skip
        trainer.train()
        trainers[shared] = trainer
    assert logged(trainers[True], "loss") == pytest.approx(logged(trainers[False], "loss"), rel=1e-4, abs=1e-6)
    for (name, a), (_, b) in zip(trainers[True].model.named_parameters(), trainers[False].model.named_parameters()):
        torch.testing.assert_close(a, b, **TOL, msg=name)


@pytest.mark.real_model
def test_smollm2_with_lora_trains_alike_with_and_without_sharing(tmp_path):
    """SmolLM2-135M-Instruct and its chat template (prompts of about 40 tokens, shared by each group of 2), a LoRA
    adapter, fp32: a plain step, then a seeded one (the step-1 shard's seeds), the same with the switch on and off.
    The reward is the reply's length, so every group has a spread and a gradient."""
    from tests.test_real_model import chat_prompts, config, lora
    from ts_trl import SeedGRPOTrainer, smollm2_135m_instruct

    def length_reward(completions, **kwargs):
        return [len(c[-1]["content"]) / 50 for c in completions]

    path, histories = smollm2_135m_instruct(), {}
    for shared in (True, False):
        args = config(
            tmp_path / str(shared), max_steps=2, save_strategy="no", max_completion_length=16, bf16=False,
            optim="sgd", learning_rate=0.05, shared_prefix=shared,
        )  # fmt: skip
        trainer = SeedGRPOTrainer(
            model=path, reward_funcs=length_reward, args=args, train_dataset=chat_prompts(), peft_config=lora()
        )
        trainer.train()
        histories[shared] = trainer.state.log_history

    def logged_values(history, key):
        return [h[key] for h in history if key in h]

    shares = logged_values(histories[True], "shared_prefix/token_share")
    assert len(shares) == 2 and max(shares) < 0.9  # the chat prompt is most of a row
    assert logged_values(histories[True], "seeds/seeded_group_share")[-1] > 0
    assert min(logged_values(histories[True], "grad_norm")) > 0
    for key in ("loss", "grad_norm", "entropy", "completions/mean_length", "reward", "seeds/seeded_group_share"):
        on, off = logged_values(histories[True], key), logged_values(histories[False], key)
        assert len(on) == 2 and on == pytest.approx(off, rel=1e-4, abs=1e-6), key


def test_where_packing_cannot_be_exact_the_trl_forward_runs_with_one_warning(make_trainer, caplog, monkeypatch):
    trainer = make_trainer(max_steps=1, seed_fraction=0.0)
    model = trainer.model
    ids, mask, C = _batch(model.config.vocab_size)
    trainer.args.shared_prefix = False
    reference, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, mask, C)
    trainer.args.shared_prefix = True
    before = len(trainer._metrics["train"]["shared_prefix/token_share"])
    with caplog.at_level(logging.WARNING, logger="ts_trl.trainer.shared_prefix"):
        for _ in range(2):  # warned once per reason
            logps, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, mask, C, token_type_ids=ids * 0)
        torch.testing.assert_close(logps, reference)
        # as with flash or flex attention, which take no arbitrary 4D mask
        monkeypatch.setattr("ts_trl.trainer.shared_prefix.EXACT_ATTENTION", ("eager",))
        trainer._get_per_token_logps_and_entropies(model, ids, mask, C)
        monkeypatch.undo()
        distinct = torch.cat([ids[:1], ids[4:5]])  # one unpadded row per prompt: nothing to share
        trainer._get_per_token_logps_and_entropies(model, distinct, torch.ones_like(distinct), C)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 3, warnings
    assert "token-type" in warnings[0] and "'sdpa'" in warnings[1] and "no tokens are shared" in warnings[2]
    assert len(trainer._metrics["train"]["shared_prefix/token_share"]) == before


def test_where_packing_would_cost_more_the_trl_forward_runs_with_one_warning(make_trainer, caplog):
    """Two micro-batches of 8 rows with a 2-token prompt and 30-token completions. In the first the completions differ
    from their first token: the packed group's attention square costs the tiny model more than the 7 prompt copies
    save, so that micro-batch takes TRL's path. In the second they share 24 tokens (a seed prefix) and are packed."""
    trainer = make_trainer(max_steps=1, seed_fraction=0.0, **FP32)
    model = trainer.model
    model.train()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (16, 32), generator=g)
    ids[:8, :2] = ids[0, :2]
    ids[8:, :26] = ids[8, :26]
    mask = torch.ones_like(ids)
    results = {}
    for on in (True, False):
        trainer.args.shared_prefix = on
        with caplog.at_level(logging.WARNING, logger="ts_trl.trainer.shared_prefix"):
            for _ in range(2):  # warned once
                logps, entropies, _ = trainer._get_per_token_logps_and_entropies(
                    model, ids, mask, 30, batch_size=8, compute_entropy=True
                )
        results[on] = logps.detach(), entropies.detach()
    torch.testing.assert_close(results[True], results[False], **TOL)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "cost estimate" in warnings[0], warnings
    second = pack_rows(ids[8:], mask[8:], 30, cost=forward_cost(model.config))
    assert logged_share(trainer) == (8 * 32 + second.tokens) / (16 * 32)  # the costly 8 rows computed whole
