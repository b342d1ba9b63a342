"""Known-answer tests for the objectives (papers 000, 001, 002, 004) and the collapse metrics."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from training import metrics
from training.objectives import OBJECTIVES
from training.objectives.infonce import InfoNCE
from training.objectives.rank_reduction import RankReduction


def seeded(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# --- metrics -------------------------------------------------------------------------------------


def test_effective_rank_known_answers() -> None:
    assert metrics.effective_rank(torch.eye(8)) == pytest.approx(8.0, rel=1e-5)
    assert metrics.effective_rank(torch.ones(8, 5)) == pytest.approx(1.0, abs=1e-4)
    # two orthogonal directions, 3 rows on one and 1 on the other: λ = (3/4, 1/4)
    z = torch.tensor([[1.0, 0], [2, 0], [5, 0], [0, 3]])
    entropy = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert metrics.effective_rank(z) == pytest.approx(math.exp(entropy), rel=1e-5)
    assert metrics.eigenvalues(seeded(6, 10)).sum().item() == pytest.approx(1.0, rel=1e-5)


def test_alignment_uniformity_std_and_accuracy() -> None:
    z = seeded(16, 8)
    assert metrics.alignment(z, 3 * z) == pytest.approx(0.0, abs=1e-6)
    assert metrics.alignment(torch.eye(2), -torch.eye(2)) == pytest.approx(4.0)
    # two antipodal points: ‖z_i − z_j‖² = 4 → log exp(−8) = −8
    assert metrics.uniformity(torch.tensor([[1.0, 0], [-1.0, 0]])) == pytest.approx(-8.0)
    assert metrics.per_dimension_std(torch.ones(4, 3)) == pytest.approx(0.0)
    assert metrics.contrastive_accuracy(torch.tensor([[2.0, 1], [3, 0]])) == 0.5
    with pytest.raises(ValueError, match=r"must be a \(B, D\) tensor with B >= 2"):
        metrics.per_dimension_std(torch.ones(1, 3))


# --- InfoNCE (paper 000 Eq. 1) -------------------------------------------------------------------


@pytest.mark.parametrize("tau", [0.05, 0.5])
def test_infonce_aligned_orthogonal_views_reach_the_minimum(tau: float) -> None:
    b = 8
    views = 2.5 * torch.eye(b, 16)[:, torch.randperm(16, generator=torch.Generator().manual_seed(1))]
    loss, stats = InfoNCE(temperature=tau)(views, views)
    # sim = 1 for the positive, 0 for the B−1 orthogonal negatives
    assert loss.item() == pytest.approx(math.log(1 + (b - 1) * math.exp(-1 / tau)), rel=1e-5, abs=1e-6)
    assert stats["accuracy"] == 1.0 and stats["positive_cosine"] == pytest.approx(1.0)
    worse, _ = InfoNCE(temperature=tau)(views, views + 0.3 * seeded(b, 16))
    assert worse.item() > loss.item()


def test_infonce_matches_equation_one_written_out() -> None:
    a, p, tau = seeded(5, 7, seed=1), seeded(5, 7, seed=2), 0.1
    sim = F.cosine_similarity(a[:, None, :], p[None, :, :], dim=-1)  # (B, B)
    expected = torch.stack([-torch.log(torch.exp(sim[i, i] / tau) / torch.exp(sim[i] / tau).sum()) for i in range(5)])
    loss, stats = InfoNCE(temperature=tau)(a, p)
    assert loss.item() == pytest.approx(expected.mean().item(), rel=1e-5)
    assert stats["loss"] == pytest.approx(loss.item())
    assert {"std", "effective_rank", "alignment", "uniformity", "negative_cosine"} <= stats.keys()
    sym, _ = InfoNCE(temperature=tau, symmetric=True)(a, p)
    backward, _ = InfoNCE(temperature=tau)(p, a)
    assert sym.item() == pytest.approx(0.5 * (loss.item() + backward.item()), rel=1e-5)


def test_infonce_accuracy_counts_misses_and_gradient_flows_to_both_views() -> None:
    a = torch.eye(4, requires_grad=True)
    p = torch.eye(4)[[1, 0, 2, 3]].requires_grad_(True)  # rows 0 and 1 pair with the wrong partner
    loss, stats = InfoNCE()(a, p)
    assert stats["accuracy"] == 0.5
    loss.backward()
    assert a.grad is not None and a.grad.abs().sum() > 0 and p.grad is not None and p.grad.abs().sum() > 0


def test_infonce_bad_arguments_say_what_to_fix() -> None:
    with pytest.raises(ValueError, match="temperature must be > 0"):
        InfoNCE(temperature=0)
    with pytest.raises(ValueError, match="same shape with B >= 2"):
        InfoNCE()(torch.ones(3, 4), torch.ones(2, 4))


# --- rank reduction (paper 002 Eq. 6) ------------------------------------------------------------


def test_rank_reduction_is_gamma_times_entropy_of_eigenvalues() -> None:
    a, p = seeded(6, 10, seed=3), seeded(6, 10, seed=4)
    z = F.normalize(torch.cat([a, p]), dim=-1)
    lam = torch.linalg.eigvalsh(z.T @ z / z.shape[0]).clamp_min(0)  # eigenvalues of ZᵀZ/N, D of them
    lam = lam[lam > 1e-9]
    neg_entropy = (lam * lam.log()).sum().item()  # Σ λ log λ
    term, stats = RankReduction(gamma=0.5)(a, p)
    # the sign follows paper 002 Tables 1-2 (γ > 0 lowers rank), see the module docstring
    assert term.item() == pytest.approx(-0.5 * neg_entropy, rel=1e-4)
    assert stats["eigen_entropy"] == pytest.approx(-neg_entropy, rel=1e-4)
    assert stats["effective_rank"] == pytest.approx(math.exp(-neg_entropy), rel=1e-4)


def test_rank_reduction_gradient_lowers_rank() -> None:
    z = seeded(12, 6, seed=5).requires_grad_(True)
    rr = RankReduction(gamma=1.0)
    before = metrics.effective_rank(z)
    optimiser = torch.optim.SGD([z], lr=0.5)
    for _ in range(20):
        optimiser.zero_grad()
        term, _ = rr(z)
        term.backward()
        assert torch.isfinite(z.grad).all()
        optimiser.step()
    assert metrics.effective_rank(z) < before - 0.5
    with pytest.raises(ValueError, match="gamma must be a finite number"):
        RankReduction(gamma=float("nan"))


def test_registry_names() -> None:
    assert OBJECTIVES["infonce"] is InfoNCE and OBJECTIVES["simcse"] is InfoNCE
    assert OBJECTIVES["rank_reduction"] is RankReduction
