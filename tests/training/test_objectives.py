"""Known-answer tests for the objectives (papers 000, 001, 002, 004) and the collapse metrics."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from training import metrics
from training.objectives import OBJECTIVES
from training.objectives.barlow_twins import BarlowTwins
from training.objectives.cosent import CoSENT
from training.objectives.infonce import InfoNCE
from training.objectives.mse_distillation import MSEDistillation
from training.objectives.rank_reduction import RankReduction
from training.objectives.sct import SCT
from training.objectives.vicreg import VICReg
from training.objectives.vicreg import variance_term as vicreg_variance


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """These tensors are tiny: on a shared 2-core machine intra-op threads only add contention (10x here)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def seeded(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# --- metrics -------------------------------------------------------------------------------------


def test_eigenvalue_spectrum_known_answers() -> None:
    # the differentiable spectrum rank reduction uses: exp(entropy) is the effective rank
    assert math.exp(metrics.eigenvalue_entropy(torch.eye(8)).item()) == pytest.approx(8.0, rel=1e-5)
    assert math.exp(metrics.eigenvalue_entropy(torch.ones(8, 5)).item()) == pytest.approx(1.0, abs=1e-4)
    # two orthogonal directions, 3 rows on one and 1 on the other: λ = (3/4, 1/4)
    z = torch.tensor([[1.0, 0], [2, 0], [5, 0], [0, 3]])
    entropy = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert metrics.eigenvalue_entropy(z).item() == pytest.approx(entropy, rel=1e-5)
    assert metrics.eigenvalues(seeded(6, 10)).sum().item() == pytest.approx(1.0, rel=1e-5)


def test_embedding_metrics_std_and_accuracy_known_answers() -> None:
    z = seeded(16, 8)
    same = metrics.embedding_metrics(z, 3 * z)
    assert same["alignment"] == pytest.approx(0.0, abs=1e-6)
    assert same["effective_rank"] == pytest.approx(math.exp(metrics.eigenvalue_entropy(z).item()), rel=1e-4)
    opposite = metrics.embedding_metrics(torch.eye(2), -torch.eye(2))
    assert opposite["alignment"] == pytest.approx(4.0)
    assert opposite["effective_rank"] == pytest.approx(2.0, rel=1e-5)
    # ±e1, ±e2: each point has two neighbours at ‖z_i − z_j‖² = 2 and one at 4
    assert opposite["uniformity"] == pytest.approx(math.log((2 * math.exp(-4) + math.exp(-8)) / 3))
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


def descend(
    params: list[torch.Tensor], loss_fn: Callable[[], tuple[torch.Tensor, dict[str, float]]], steps: int, lr: float
) -> list[dict[str, float]]:
    """Plain gradient descent; returns each step's metrics."""
    history = []
    for _ in range(steps):
        for p in params:
            p.grad = None
        loss, stats = loss_fn()
        loss.backward()
        with torch.no_grad():
            for p in params:
                assert p.grad is not None and torch.isfinite(p.grad).all()
                p -= lr * p.grad
        history.append(stats)
    return history


@pytest.mark.parametrize(("gamma", "direction"), [(1.0, -1), (-1.0, 1)])
def test_rank_reduction_gradient_lowers_rank_for_positive_gamma(gamma: float, direction: int) -> None:
    z = seeded(12, 6, seed=5).requires_grad_(True)
    before = metrics.embedding_metrics(z, z)["effective_rank"]
    descend([z], lambda: RankReduction(gamma=gamma)(z), steps=8, lr=1.0)
    assert direction * (metrics.embedding_metrics(z, z)["effective_rank"] - before) > 0.3


def test_rank_reduction_bad_gamma() -> None:
    with pytest.raises(ValueError, match="gamma must be a finite number"):
        RankReduction(gamma=float("nan"))


def test_registry_names() -> None:
    assert OBJECTIVES["infonce"] is InfoNCE and OBJECTIVES["simcse"] is InfoNCE
    assert OBJECTIVES["rank_reduction"] is RankReduction and OBJECTIVES["sct"] is SCT
    assert OBJECTIVES["barlow_twins"] is BarlowTwins and OBJECTIVES["vicreg"] is VICReg
    assert OBJECTIVES["mse_distillation"] is MSEDistillation and OBJECTIVES["cosent"] is CoSENT


# --- CoSENT (Su 2022; TMFT's supervised loss) -------------------------------------------------------


@pytest.mark.parametrize("scale", [20.0, 5.0])
def test_cosent_known_answer_for_two_pairs(scale: float) -> None:
    view1 = torch.tensor([[1.0, 0], [2.0, 0]])
    view2 = torch.tensor([[3.0, 0], [0, 1.0]])  # cosines (1, 0)
    loss, stats = CoSENT(scale=scale)(view1, view2, scores=torch.tensor([5.0, 1.0]))  # ordered like the cosines
    assert loss.item() == pytest.approx(math.log(1 + math.exp(-scale)), rel=1e-5, abs=1e-6)
    assert stats["ordered_accuracy"] == 1.0 and stats["cosine"] == pytest.approx(0.5)
    loss, stats = CoSENT(scale=scale)(view1, view2, scores=torch.tensor([1.0, 5.0]))  # the wrong order
    assert loss.item() == pytest.approx(math.log(1 + math.exp(scale)), rel=1e-5)
    assert stats["ordered_accuracy"] == 0.0


def test_cosent_prefers_correctly_ordered_similarities() -> None:
    a = F.normalize(seeded(4, 8), dim=-1)
    scores = torch.tensor([3.0, 2.0, 1.0, 0.0])
    close, far = a + 0.01 * seeded(4, 8, seed=1), -a
    mixed = torch.stack([close[0], close[1], far[2], far[3]])
    reversed_ = torch.stack([far[0], far[1], close[2], close[3]])
    assert CoSENT()(a, mixed, scores=scores)[0] < CoSENT()(a, reversed_, scores=scores)[0]
    loss, stats = CoSENT()(a, a, scores=torch.zeros(4))  # no ordered pair: log(1) = 0
    assert loss.item() == pytest.approx(0.0) and stats["ordered_accuracy"] == 1.0


def test_cosent_bad_arguments_say_what_to_fix() -> None:
    with pytest.raises(ValueError, match="scale must be a positive number"):
        CoSENT(scale=0)
    with pytest.raises(ValueError, match="CoSENT needs scores"):
        CoSENT()(torch.ones(3, 4), torch.ones(3, 4))
    with pytest.raises(ValueError, match=r"and \(B,\) scores"):
        CoSENT()(torch.ones(3, 4), torch.ones(3, 4), scores=torch.ones(2))


# --- plain MSE distillation (the baseline SCT is compared with) ------------------------------------


def test_mse_distillation_is_the_squared_distance_to_the_teacher() -> None:
    teacher1, teacher2 = torch.randn(4, 6), torch.randn(4, 6)
    loss, stats = MSEDistillation(6)(teacher1.clone(), teacher2.clone(), teacher1, teacher2)
    assert float(loss) == 0.0 and stats["cosine"] == pytest.approx(1.0)
    student1 = teacher1 + torch.tensor([3.0, 4.0, 0, 0, 0, 0])  # every row 5 away from its teacher vector
    loss, _ = MSEDistillation(6)(student1, teacher2.clone(), teacher1, teacher2)
    assert float(loss) == pytest.approx(0.5 * 25.0)


def test_mse_distillation_maps_a_smaller_student_and_never_trains_the_teacher() -> None:
    objective = MSEDistillation(3, reference_dim=6)
    student1, student2 = torch.randn(4, 3, requires_grad=True), torch.randn(4, 3, requires_grad=True)
    teacher1, teacher2 = torch.randn(4, 6, requires_grad=True), torch.randn(4, 6, requires_grad=True)
    loss, _ = objective(student1, student2, teacher1, teacher2)
    loss.backward()
    assert student1.grad is not None and objective.projector.weight.grad is not None
    assert teacher1.grad is None and teacher2.grad is None
    with pytest.raises(ValueError, match="teacher's embeddings of both views"):
        objective(student1, student2)


# --- SCT (paper 001 Eqs. 1-4) ----------------------------------------------------------------------


def test_sct_kl_is_zero_when_online_equals_reference() -> None:
    x = F.normalize(seeded(4, 8, seed=6), dim=-1)
    torch.manual_seed(0)  # the queues' random initial vectors
    sct = SCT(student_dim=8, queue_size=16, tau_online=0.05, tau_ref=0.05, projector_layers=0)
    loss, stats = sct(x, x, reference1=x, reference2=x)
    assert loss.item() == pytest.approx(0.0, abs=1e-6) and stats["accuracy"] == 1.0
    # a different temperature on the reference side makes the distributions differ
    torch.manual_seed(0)
    sharper = SCT(student_dim=8, queue_size=16, tau_online=0.05, tau_ref=0.03, projector_layers=0)
    assert sharper(x, x, reference1=x, reference2=x)[0].item() > 1e-4


def test_sct_matches_equations_written_out() -> None:
    torch.manual_seed(0)
    b, d, k, t_on, t_ref = 3, 5, 7, 0.1, 0.07
    sct = SCT(student_dim=d, queue_size=k, tau_online=t_on, tau_ref=t_ref, projector_layers=0)
    v1, v2, r1, r2 = (F.normalize(seeded(b, d, seed=s), dim=-1) for s in (10, 11, 12, 13))
    d1 = torch.cat([sct.queue1.vectors, r1])
    d2 = torch.cat([sct.queue2.vectors, r2])

    def sr(z: torch.Tensor, queue: torch.Tensor, tau: float) -> torch.Tensor:  # Eq. 1
        return torch.softmax(z @ queue.T / tau, dim=-1)

    def kl(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return (p * (p.log() - q.log())).sum(-1).mean()

    expected = 0.5 * kl(sr(r2, d2, t_ref), sr(v1, d2, t_on)) + 0.5 * kl(sr(r1, d1, t_ref), sr(v2, d1, t_on))
    loss, _ = sct(v1, v2, reference1=r1, reference2=r2)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    # the batch's references were enqueued afterwards, oldest first
    assert torch.allclose(sct.queue1.ordered()[-b:], r1) and torch.allclose(sct.queue2.ordered()[-b:], r2)


def test_sct_gradient_reaches_online_views_and_projector_never_the_reference() -> None:
    sct = SCT(student_dim=6, reference_dim=10, queue_size=32, expansion=2)
    v1, v2 = seeded(4, 6, seed=1).requires_grad_(True), seeded(4, 6, seed=2).requires_grad_(True)
    r1, r2 = seeded(4, 10, seed=3).requires_grad_(True), seeded(4, 10, seed=4).requires_grad_(True)
    loss, _ = sct(v1, v2, reference1=r1, reference2=r2)
    loss.backward()
    assert v1.grad is not None and v1.grad.abs().sum() > 0 and v2.grad is not None
    assert r1.grad is None and r2.grad is None  # SG on the reference (Eq. 2)
    grads = [p.grad for p in sct.projector.parameters()]
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)
    assert all(not b.requires_grad for b in sct.buffers())


def test_sct_distillation_student_dim_differs_from_teacher() -> None:
    sct = SCT(student_dim=4, reference_dim=12, queue_size=20, distillation=True, expansion=2)
    assert sct.queue1.dim == 12 and sct.projector(torch.ones(2, 4)).shape == (2, 12)
    v1, v2 = seeded(5, 4, seed=1).requires_grad_(True), seeded(5, 4, seed=2)
    t1, t2 = seeded(5, 12, seed=3), seeded(5, 12, seed=4)
    loss, stats = sct(v1, v2, reference1=t1, reference2=t2)
    assert loss.item() == pytest.approx(stats["loss_sct"] + stats["loss_cd"], rel=1e-5)
    loss.backward()
    assert v1.grad is not None and v1.grad.abs().sum() > 0
    only_cd = SCT(student_dim=4, reference_dim=12, queue_size=20, distillation=True, sct_weight=0.0, expansion=2)
    only_cd.load_state_dict(sct.state_dict())
    loss_cd, stats_cd = only_cd(v1, v2, reference1=t1, reference2=t2)
    assert loss_cd.item() == pytest.approx(stats_cd["loss_cd"], rel=1e-6)


def test_sct_mse_weight_adds_the_squared_distance_to_the_teacher() -> None:
    torch.manual_seed(0)
    plain = SCT(student_dim=6, queue_size=16, distillation=True, projector_layers=0)
    torch.manual_seed(0)
    with_mse = SCT(student_dim=6, queue_size=16, distillation=True, projector_layers=0, mse_weight=2.0)
    v1, v2, t1, t2 = (F.normalize(seeded(4, 6, seed=s), dim=-1) for s in (1, 2, 3, 4))
    loss, stats = plain(v1, v2, reference1=t1, reference2=t2)
    loss_mse, stats_mse = with_mse(v1, v2, reference1=t1, reference2=t2)
    expected_mse, _ = MSEDistillation(6)(v1, v2, t1, t2)
    assert "loss_mse" not in stats and stats_mse["loss_mse"] == pytest.approx(expected_mse.item(), rel=1e-5)
    assert loss_mse.item() == pytest.approx(loss.item() + 2.0 * expected_mse.item(), rel=1e-5)
    # a student equal to its teacher adds nothing
    torch.manual_seed(0)
    same = SCT(student_dim=6, queue_size=16, distillation=True, projector_layers=0, mse_weight=2.0)
    assert same(t1, t2, reference1=t1, reference2=t2)[1]["loss_mse"] == pytest.approx(0.0, abs=1e-7)


def test_sct_training_teaches_the_student_the_teacher_neighbourhoods() -> None:
    """A few gradient steps on fixed data raise the cross-view accuracy (a smoke test of the whole loss)."""
    torch.manual_seed(0)
    teacher = F.normalize(seeded(16, 12, seed=5), dim=-1)
    student = seeded(16, 6, seed=6).requires_grad_(True)
    sct = SCT(student_dim=6, reference_dim=12, queue_size=32, distillation=True, expansion=4)
    optimiser = torch.optim.Adam([student, *sct.parameters()], lr=1e-2)
    history = []
    for _ in range(25):
        optimiser.zero_grad()
        loss, stats = sct(student, student, reference1=teacher, reference2=teacher)
        loss.backward()
        optimiser.step()
        history.append(stats)
    assert history[-1]["accuracy"] > history[0]["accuracy"] and history[-1]["accuracy"] >= 0.9
    assert history[-1]["loss"] < history[0]["loss"]


def test_sct_bad_arguments_say_what_to_fix() -> None:
    with pytest.raises(ValueError, match="tau_online and tau_ref must be > 0"):
        SCT(student_dim=4, tau_ref=0)
    with pytest.raises(ValueError, match="set projector_layers >= 1"):
        SCT(student_dim=4, reference_dim=8, projector_layers=0)
    with pytest.raises(ValueError, match="mse_weight must be >= 0"):
        SCT(student_dim=4, mse_weight=-1.0)
    sct = SCT(student_dim=4, reference_dim=8, queue_size=8, expansion=1)
    with pytest.raises(ValueError, match="SCT needs reference1 and reference2"):
        sct(torch.ones(2, 4), torch.ones(2, 4))
    with pytest.raises(ValueError, match="set reference_dim"):
        sct(torch.ones(2, 4), torch.ones(2, 4), reference1=torch.ones(2, 4), reference2=torch.ones(2, 4))


# --- Barlow Twins and VICReg (paper 004 Eqs. 2-3) -----------------------------------------------------


def whitened(b: int, d: int, seed: int = 0) -> torch.Tensor:
    """Rows whose columns have mean 0, biased variance 1 and zero correlation."""
    x = seeded(b, d, seed=seed)
    x = x - x.mean(0)
    cov = x.T @ x / b
    return x @ torch.linalg.inv(torch.linalg.cholesky(cov)).T


def test_barlow_twins_zero_for_identical_whitened_views() -> None:
    z = whitened(64, 8).double()
    loss, stats = BarlowTwins(input_dim=8, projector_dim=0)(z, z)
    assert loss.item() == pytest.approx(0.0, abs=1e-8)
    assert stats["off_diagonal"] == pytest.approx(0.0, abs=1e-8)
    # identical but correlated views: perfect invariance, yet the redundancy term is positive
    mixed = z @ torch.tensor(np.eye(8) + 0.5, dtype=torch.float64)
    loss, stats = BarlowTwins(input_dim=8, projector_dim=0)(mixed, mixed)
    assert stats["on_diagonal"] == pytest.approx(0.0, abs=1e-8) and stats["off_diagonal"] > 0.1


def test_barlow_twins_matches_pearson_cross_correlation() -> None:
    a, b = seeded(32, 5, seed=1).double(), seeded(32, 5, seed=2).double()
    c = torch.tensor(np.corrcoef(a.T.numpy(), b.T.numpy())[:5, 5:])  # Pearson C_ij
    lam = 0.01
    expected = ((1 - c.diagonal()) ** 2).sum() + lam * (c**2).sum() - lam * (c.diagonal() ** 2).sum()
    loss, _ = BarlowTwins(input_dim=5, projector_dim=0, off_diagonal_weight=lam)(a, b)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-4)


def test_vicreg_variance_term_zero_when_every_std_at_least_one() -> None:
    wide = 3 * seeded(64, 6, seed=3)
    assert vicreg_variance(wide).item() == 0.0
    assert vicreg_variance(torch.ones(8, 6)).item() == pytest.approx(1 - math.sqrt(1e-4))  # collapsed
    half = torch.tensor([[0.5], [-0.5]]).repeat(1, 3)  # unbiased variance 0.5 in every dimension
    assert vicreg_variance(half).item() == pytest.approx(1 - math.sqrt(0.5 + 1e-4))


def test_vicreg_terms_written_out() -> None:
    a, b = seeded(16, 4, seed=4), seeded(16, 4, seed=5)
    loss, stats = VICReg(input_dim=4, projector_dim=0)(a, b)
    ca, cb = torch.cov(a.T), torch.cov(b.T)
    off = lambda m: (m**2).sum() - (m.diagonal() ** 2).sum()  # noqa: E731
    assert stats["invariance"] == pytest.approx(((a - b) ** 2).mean().item(), rel=1e-5)
    assert stats["covariance"] == pytest.approx((off(ca) / 4 + off(cb) / 4).item(), rel=1e-4)
    expected = 25 * stats["invariance"] + 25 * stats["variance"] + stats["covariance"]
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    z = whitened(64, 4, seed=6)
    assert VICReg(input_dim=4, projector_dim=0)(z, z)[1]["covariance"] == pytest.approx(0.0, abs=1e-3)


@pytest.mark.parametrize("cls", [BarlowTwins, VICReg])
def test_non_contrastive_projector_gets_gradients(cls: type) -> None:
    objective = cls(input_dim=6, projector_dim=16)
    v1, v2 = seeded(8, 6, seed=7).requires_grad_(True), seeded(8, 6, seed=8)
    loss, stats = objective(v1, v2)
    loss.backward()
    assert v1.grad is not None and v1.grad.abs().sum() > 0
    assert all(p.grad is not None for p in objective.projector.parameters())
    assert {"loss", "accuracy", "effective_rank", "std"} <= stats.keys()


def test_non_contrastive_bad_arguments_say_what_to_fix() -> None:
    with pytest.raises(ValueError, match=r"off_diagonal_weight \(λ\) must be >= 0"):
        BarlowTwins(input_dim=4, off_diagonal_weight=-1)
    with pytest.raises(ValueError, match="variance_weight must be >= 0"):
        VICReg(input_dim=4, variance_weight=-1)
    with pytest.raises(ValueError, match="projector_dim >= 0"):
        VICReg(input_dim=4, projector_dim=-2)
    with pytest.raises(ValueError, match="same shape with B >= 2"):
        BarlowTwins(input_dim=4, projector_dim=0)(torch.ones(1, 4), torch.ones(1, 4))
