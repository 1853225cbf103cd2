"""ResMLP on tensor_parallel_size=2: logits, loss and every gradient equal the plain-PyTorch
ResMLP of the paper's equations on the gathered full weights, and the cross-channel MLP is
really split (local shard shapes)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from common import parse_out_dir, run_checks
from resmlp_reference import reference_logits
from torch.distributed.tensor import DTensor, distribute_tensor

from libai import dist
from libai.models import ResMLP


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def main():
    out_dir, _, _ = parse_out_dir()

    def checks():
        dist.setup_dist_util({"tensor_parallel_size": 2})
        torch.manual_seed(0)
        model = ResMLP(img_size=16, patch_size=4, embed_dim=12, depth=2, num_classes=5)
        with torch.no_grad():  # the same random values on every rank, alpha/gamma included
            gen = torch.Generator().manual_seed(1)
            for p in model.parameters():
                value = torch.randn(full(p).shape, generator=gen) * 0.3
                if isinstance(p, DTensor):
                    value = distribute_tensor(value, p.device_mesh, p.placements)
                p.copy_(value)
        weights = {
            k: full(v).detach().clone().requires_grad_() for k, v in model.state_dict().items()
        }
        images = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(2))
        labels = torch.tensor([0, 4, 2])
        model.train()
        loss = model(images, labels)["loss"]
        loss.backward()
        want = F.cross_entropy(reference_logits(weights, images, depth=2, patch=4), labels)
        want.backward()
        grads = {
            name: float((full(p.grad) - weights[name].grad).abs().max())
            for name, p in model.named_parameters()
        }
        local = model.blocks["0"].mlp
        return {
            "loss": float(loss),
            "want": float(want),
            "max_grad_diff": max(grads.values()),
            "n_grads": len(grads),
            "h_to_4h_local": list(local.dense_h_to_4h.weight.to_local().shape),
            "4h_to_h_local": list(local.dense_4h_to_h.weight.to_local().shape),
        }

    run_checks(out_dir, checks)


if __name__ == "__main__":
    main()
