"""Plans applied onto the module survive DDP and FSDP2 (``fully_shard``): gloo, 2 processes.

Each rank steps on its half of a batch; the gradients (all-reduced by DDP,
reduce-scattered by FSDP2, gathered here) must equal a single-process step on
the whole batch, every parameter must get one, and a run with the plan must
give the same gradients as the same distributed run without it, bitwise.
"""

from __future__ import annotations

import os
import pickle

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import scheduler
import solvers
from scheduler.tracing.tracer import capture

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built in")


def _model():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=64, use_cache=False,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(cfg).train()


def _batch():
    ids = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(1))
    return ids


def _grads(model):
    out = {}
    for n, p in model.named_parameters():
        g = p.grad
        if g is not None and hasattr(g, "full_tensor"):
            g = g.full_tensor()
        out[n] = None if g is None else g.detach().clone()
    return out


def _worker(rank: int, world: int, init: str, modes: tuple[str, ...], plan_bytes: bytes, out_dir: str) -> None:
    """One process group for every mode: the spawn and gloo's set-up cost more than a step (test_distributed_runs
    does the same)."""
    torch.set_num_threads(1)  # two processes on two cores (scheduler.measuring.distributed does the same)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        plan = pickle.loads(plan_bytes)
        ids = _batch()[rank * 2:(rank + 1) * 2]
        for mode in modes:
            results = {}
            for with_plan in (False, True):
                model = _model()
                if with_plan:
                    scheduler.apply(model, plan)
                if mode == "ddp":
                    wrapped = torch.nn.parallel.DistributedDataParallel(model)
                else:
                    from torch.distributed.fsdp import fully_shard

                    for block in model.transformer.h:
                        fully_shard(block)
                    wrapped = fully_shard(model)
                loss = wrapped(input_ids=ids, labels=ids).loss
                loss.backward()
                results[with_plan] = _grads(model)
            if rank == 0:
                torch.save(results, os.path.join(out_dir, f"{mode}.pt"))
            # both ranks done with this mode's collectives before the next (and before the group goes: a rank
            # tearing gloo down while the other still used it once aborted it, "terminate called ...")
            dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def plan():
    model = _model()
    ids = _batch()[:2]
    graph = capture(model, (), {"input_ids": ids, "labels": ids}, loss=lambda out: out.loss).graph
    per_block = solvers.solve(graph, 1 << 50, solver="per-module")
    return scheduler.solve(graph, per_block.peak_bytes, solver="ilp", time_limit_s=60)


MODES = ("ddp", "fsdp2")


@pytest.fixture(scope="module")
def runs(plan, tmp_path_factory):
    """mode -> {with_plan: gradients} from one spawn of 2 processes that runs every mode."""
    out = tmp_path_factory.mktemp("gloo")
    init = f"file://{out / 'rendezvous'}"
    mp.spawn(_worker, args=(2, init, MODES, pickle.dumps(plan), str(out)), nprocs=2, join=True)
    return {mode: torch.load(out / f"{mode}.pt") for mode in MODES}


@pytest.mark.parametrize("mode", MODES)
def test_distributed_step_with_the_plan_equals_one_process(runs, mode):
    results = runs[mode]
    single = _model()
    ids = _batch()
    single(input_ids=ids, labels=ids).loss.backward()
    reference = _grads(single)
    for with_plan in (False, True):
        grads = results[with_plan]
        assert grads.keys() == reference.keys()
        assert all(g is not None for g in grads.values()), "every parameter gets a gradient"
        for name, g in grads.items():
            torch.testing.assert_close(g, reference[name], rtol=1e-5, atol=1e-6, msg=name)
    for name in reference:
        assert torch.equal(results[True][name], results[False][name]), name
