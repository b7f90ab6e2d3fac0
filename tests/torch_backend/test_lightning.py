"""Lightning on backend "ndist": ``self.log(..., sync_dist=True)`` in ``validation_step``.

Lightning averages a logged value with ``ReduceOp.AVG`` on every backend but one named
"gloo" (where it sums and divides itself), and that includes the int64 count of samples
behind the mean: the integer AVG of docs/collectives.md. The group is made before the
Trainer (through a FileStore: no port), which Lightning's DDPStrategy then uses as it is.
It runs on both of backend "ndist"'s backends (docs/torch.md, "The compiled backend"): the
compiled one (the default) does the integer AVG in the engine, the Python one in ndist's API.
"""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("lightning")

from tests.torch_backend.torch_helpers import run_torch  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]


def _fit(rank, world_size, root):
    import lightning.pytorch as pl
    import torch
    import torch.distributed as dist
    from lightning.fabric.plugins.environments import ClusterEnvironment
    from lightning.pytorch.strategies import DDPStrategy
    from torch.utils.data import DataLoader, TensorDataset

    import ndist.torch.ops as ops

    class Given(ClusterEnvironment):
        """The ranks run_torch started, in the group it made (Lightning starts nothing)."""

        @property
        def creates_processes_externally(self):
            return True

        @property
        def main_address(self):  # read only to initialise a group, which exists already
            return "127.0.0.1"

        @property
        def main_port(self):
            return 0

        @staticmethod
        def detect():
            return False

        def world_size(self):
            return world_size

        def set_world_size(self, size):
            assert size == world_size, size

        def global_rank(self):
            return rank

        def set_global_rank(self, r):
            assert r == rank, r

        def local_rank(self):
            return rank

        def node_rank(self):
            return 0

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, _):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def validation_step(self, batch, _):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("val_loss", loss, sync_dist=True)  # the batch size comes from the batch: int64

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    # (dtype, op, by) of every blocking all_reduce Lightning sends to backend "ndist" (through
    # torch.distributed.all_reduce, its _sync_ddp's call); by: "engine" where the compiled
    # backend ran it in the engine, else "python" (the Python backend: engine_calls is -1)
    seen = []
    if dist.get_backend() == "ndist":
        original = dist.all_reduce

        def recorded(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
            before = ops.engine_calls(group)
            work = original(tensor, op=op, group=group, async_op=async_op)
            by = "engine" if before >= 0 and ops.engine_calls(group) > before else "python"
            seen.append((str(tensor.dtype), "AVG" if op == dist.ReduceOp.AVG else "other", by))
            return work

        dist.all_reduce = recorded
    gen = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(16, 4, generator=gen), torch.randn(16, 1, generator=gen))
    trainer = pl.Trainer(
        accelerator="cpu", devices=world_size, num_nodes=1, max_epochs=1, limit_train_batches=2,
        strategy=DDPStrategy(process_group_backend=dist.get_backend(), cluster_environment=Given()),
        default_root_dir=f"{root}/rank{rank}", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(Tiny(), DataLoader(data, batch_size=2), DataLoader(data, batch_size=2))
    return float(trainer.callback_metrics["val_loss"]), seen


def test_lightning_log_sync_dist_on_ndist_equals_gloo(tmp_path, monkeypatch):
    gloo = run_torch(_fit, 2, "gloo", tmp_path, args=(str(tmp_path / "gloo"),), timeout=240)
    for compiled, by in (("auto", "engine"), ("0", "python")):  # the default, then the Python backend
        monkeypatch.setenv("NDIST_TORCH_COMPILED", compiled)
        ours = run_torch(_fit, 2, "ndist", tmp_path, args=(str(tmp_path / f"ndist{compiled}"),), timeout=240)
        for rank in range(2):
            loss, seen = ours[rank]
            # the int64 sample count went through backend "ndist" as an integer AVG
            assert ("torch.int64", "AVG", by) in seen, (compiled, seen)
            # 8 samples per rank on each: Lightning's own SUM-and-divide on Gloo gives the same mean
            assert loss == gloo[rank][0] == ours[0][0], compiled
