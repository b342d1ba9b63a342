"""SCT: self-supervised cross-view training — ``papers/001`` §3 (Eqs. 1–4), hyperparameters Table 1.

Pipeline (§3.1, Figure 3), with the encoders run by the trainer:

* online ``z^θ_v = h(f_θ(x_v))`` for views v = 1, 2 — ``view1``/``view2`` here are ``f_θ(x_v)``, the
  projector h (:class:`training.projectors.SCTProjector`) belongs to this module, so its parameters
  must go to the optimiser (``objective.parameters()``);
* reference ``z^ref_v = f_ref(x_v)`` — ``reference1``/``reference2``: in self-supervised mode f_ref has the online
  network's architecture and weights (§3.1: "identical"), so the trainer encodes the views again with the model
  being trained, without gradient (``TrainConfig.online_reference``); in distillation mode, a frozen teacher;
* two FIFO instance queues D₁, D₂ of reference vectors (:class:`training.queue.InstanceQueue`).

Similarity-score distribution (Eq. 1): ``SR(z, D, τ) = softmax_j(sim(z, d_j)/τ)``, sim a dot product
of L2-normalised vectors ("all encoder outputs are normalized"; we also normalise the projector
output, as the authors' code does), τ *divides*, τ^θ for online and τ^ref for reference vectors.

Self-supervised loss (Eq. 2), cross-view: ``c₁^θ = SR(z₁^θ, D₂, τ^θ)``, ``c₂^θ = SR(z₂^θ, D₁, τ^θ)``,
``c₁^ref = SR(z₁^ref, D₁, τ^ref)``, ``c₂^ref = SR(z₂^ref, D₂, τ^ref)`` and
``L_SCT = ½ KL(SG(c₂^ref) ‖ c₁^θ) + ½ KL(SG(c₁^ref) ‖ c₂^θ)``.

Distillation (§3.4, Eqs. 3–4): the reference network is replaced by a larger teacher f_large, the
queues hold teacher vectors, and ``L = L_SCT + L_CD`` with
``L_CD = ½ KL(SG(c₂^large) ‖ c₁^θ) + ½ KL(SG(c₁^large) ‖ c₂^θ)``, ``c_v^large = SR(z_v^large, D_v, τ^ref)``.

Readings taken where the paper is silent or ambiguous:

* *Queue contents at loss time.* §3.1 enqueues "at the beginning of each minibatch", so the current
  batch's references are among the candidates (the positive is in the queue). We score against
  ``[D; z^ref_batch]`` (k + B candidates) and then enqueue the batch, dropping the B oldest — the
  same k + B window as enqueue-then-score with a k + B queue.
* *L_SCT in distillation mode — this project's reading, not the paper's.* Eq. 3 writes ``L_SCT + L_CD``, but
  §3.4 replaces f_ref with f_large, so Eq. 2 would coincide with Eq. 4 and the paper names no second
  reference; the authors' distillation code computes only the teacher cross-view KL (Eq. 4). We read
  "self-referencing" (§3.4) as the student referencing itself: ``c_v^self = SR(SG(z_v^θ), D_v, τ^ref)`` — the
  student's own, sharper (τ^ref < τ^θ) cross-view distribution over the teacher queues is the target for the
  other view. ``sct_weight`` scales this term; its default 1 turns it on, and no recipe changes it, so it is on
  in ``sct-tiny``, ``sct-small`` and ``tmft``; 0 gives pure L_CD, as the authors' code trains.
* *Teacher dimension ≠ student dimension* (e.g. a 128-d tiny BERT under a 384-d MiniLM): the queues
  hold teacher-space vectors (``reference_dim``) and the projector maps the student's ``student_dim``
  into that space (u = ``reference_dim`` in §4.1's sizes), so every similarity is taken in one space.
  The projector is dropped after training; the student's own embedding is what ships.
* *Defaults.* Table 1, BERT-Tiny (the size class of the students here): τ^ref = 0.03, τ^θ = 0.04,
  k = 131072, lr 5e-4. We default k to 16384 (Table 1's smallest, BERT-Large) because on a 2-core CPU
  a 131072 × 384 queue costs ~4 × 3 GFLOP per step for the four score matrices; set ``queue_size``
  to the paper's value when time allows. Recipes can set everything through ``objective_params``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from training import metrics
from training.projectors import SCTProjector
from training.queue import InstanceQueue


def similarity_logits(z: Tensor, queue: Tensor, tau: float) -> Tensor:
    """``sim(z, d_j)/τ`` for every queue entry (the log-space of SR, Eq. 1): ``(B, u) × (K, u) → (B, K)``."""
    return z @ queue.T / tau


def cross_view_kl(target1: Tensor, target2: Tensor, online1: Tensor, online2: Tensor) -> Tensor:
    """``½ KL(SG(target2) ‖ online1) + ½ KL(SG(target1) ‖ online2)`` (Eqs. 2 and 4).

    ``target*`` are probabilities (B, K), ``online*`` are logits (B, K); KL is summed over the queue
    and averaged over the batch.
    """
    kl_1 = F.kl_div(F.log_softmax(online1, dim=-1), target2.detach(), reduction="batchmean")
    kl_2 = F.kl_div(F.log_softmax(online2, dim=-1), target1.detach(), reduction="batchmean")
    return 0.5 * kl_1 + 0.5 * kl_2


class SCT(nn.Module):
    """Self-supervised cross-view training loss, with optional distillation (paper 001 Eqs. 1–4).

    Inputs of ``forward``:

    ==========  ==========  ==================================================================
    view1       (B, D_s)    online encoder output f_θ(x₁) (gradient flows)
    view2       (B, D_s)    online encoder output f_θ(x₂)
    reference1  (B, D_ref)  reference f_ref(x₁): online or teacher output (stop-gradient applied here)
    reference2  (B, D_ref)  reference f_ref(x₂)
    ==========  ==========  ==================================================================

    ``distillation=False``: L = L_SCT with the references as f_ref (the online network itself, encoding the views
    again without gradient, §3.1). ``distillation=True``: the references
    are the teacher's, L = ``sct_weight`` · L_SCT(self-reference, this project's reading) + L_CD.
    ``mse_weight`` > 0 adds ``mse_weight`` · ½ Σ_v mean_b ||P(view_v) − reference_v||² (the teacher's embedding
    itself, Reimers & Gurevych 2020 Eq. 1, as `MSEDistillation` computes it; P is the projector, so the student
    must map into the reference space): L_SCT and L_CD match similarity *distributions* over the queue, which
    leave the embedding free up to what the queue can tell apart; the MSE term pins it to the teacher's. After
    the loss the references are enqueued (D₁ ← reference1, D₂ ← reference2). Metrics: ``loss``, ``loss_sct``,
    ``loss_cd`` (distillation), ``loss_mse`` (mse_weight > 0), ``accuracy`` (how often an online view's
    highest-scoring candidate is the other view's reference vector of the same text) and the collapse
    diagnostics of the student embeddings.
    """

    def __init__(
        self,
        student_dim: int,
        reference_dim: int | None = None,
        queue_size: int = 16384,
        tau_online: float = 0.04,
        tau_ref: float = 0.03,
        expansion: int = 10,
        projector_layers: int = 3,
        distillation: bool = False,
        sct_weight: float = 1.0,
        mse_weight: float = 0.0,
    ) -> None:
        super().__init__()
        reference_dim = reference_dim or student_dim
        if not (tau_online > 0 and tau_ref > 0):
            raise ValueError(
                f"tau_online and tau_ref must be > 0 (paper 001 Table 1: 0.04 and 0.03), got {tau_online}, {tau_ref}"
            )
        if projector_layers < 0:
            raise ValueError(f"projector_layers must be >= 0 (paper 001: 3; 0 = no projector), got {projector_layers}")
        if projector_layers == 0 and student_dim != reference_dim:
            raise ValueError(
                f"without a projector the student dim ({student_dim}) must equal the reference dim ({reference_dim}): "
                "set projector_layers >= 1 so the projector maps the student into the reference space"
            )
        if sct_weight < 0:
            raise ValueError(f"sct_weight must be >= 0, got {sct_weight}")
        if mse_weight < 0:
            raise ValueError(f"mse_weight must be >= 0 (0 = no MSE term), got {mse_weight}")
        self.student_dim, self.reference_dim = int(student_dim), int(reference_dim)
        self.tau_online, self.tau_ref = float(tau_online), float(tau_ref)
        self.distillation, self.sct_weight, self.mse_weight = bool(distillation), float(sct_weight), float(mse_weight)
        self.projector: nn.Module = (
            SCTProjector(student_dim, reference_dim, expansion, projector_layers) if projector_layers else nn.Identity()
        )
        self.queue1 = InstanceQueue(queue_size, reference_dim)  # D₁: references of view 1
        self.queue2 = InstanceQueue(queue_size, reference_dim)  # D₂: references of view 2

    def forward(
        self,
        view1: Tensor,
        view2: Tensor,
        reference1: Tensor | None = None,
        reference2: Tensor | None = None,
        **extra: Tensor,
    ) -> tuple[Tensor, dict[str, float]]:
        if reference1 is None or reference2 is None:
            raise ValueError(
                "SCT needs reference1 and reference2: the frozen reference (or teacher) embeddings of both views"
            )
        b = view1.shape[0]
        if view1.shape != view2.shape or view1.shape[-1] != self.student_dim:
            raise ValueError(
                f"SCT views must both be (B, {self.student_dim}), got {tuple(view1.shape)} and {tuple(view2.shape)}"
            )
        if reference1.shape != (b, self.reference_dim) or reference2.shape != (b, self.reference_dim):
            raise ValueError(
                f"SCT references must both be ({b}, {self.reference_dim}), got {tuple(reference1.shape)} "
                f"and {tuple(reference2.shape)}: set reference_dim to the reference/teacher embedding size"
            )
        dtype = self.queue1.vectors.dtype
        z1 = F.normalize(self.projector(view1), dim=-1).to(dtype)  # (B, u) z₁^θ
        z2 = F.normalize(self.projector(view2), dim=-1).to(dtype)  # (B, u) z₂^θ
        r1 = F.normalize(reference1.detach().to(dtype), dim=-1)  # (B, u) SG(z₁^ref)
        r2 = F.normalize(reference2.detach().to(dtype), dim=-1)  # (B, u) SG(z₂^ref)
        d1 = torch.cat([self.queue1.vectors, r1])  # (K, u), K = k + B: D₁ with this batch enqueued
        d2 = torch.cat([self.queue2.vectors, r2])  # (K, u)

        online1 = similarity_logits(z1, d2, self.tau_online)  # (B, K) log-space of c₁^θ = SR(z₁^θ, D₂, τ^θ)
        online2 = similarity_logits(z2, d1, self.tau_online)  # (B, K) log-space of c₂^θ = SR(z₂^θ, D₁, τ^θ)
        with torch.no_grad():
            ref1 = similarity_logits(r1, d1, self.tau_ref).softmax(-1)  # (B, K) c₁^ref (c₁^large)
            ref2 = similarity_logits(r2, d2, self.tau_ref).softmax(-1)  # (B, K) c₂^ref (c₂^large)
        stats: dict[str, float] = {}
        if self.distillation:
            loss_cd = cross_view_kl(ref1, ref2, online1, online2)  # Eq. 4
            with torch.no_grad():
                self1 = similarity_logits(z1, d1, self.tau_ref).softmax(-1)  # SR(SG(z₁^θ), D₁, τ^ref)
                self2 = similarity_logits(z2, d2, self.tau_ref).softmax(-1)  # SR(SG(z₂^θ), D₂, τ^ref)
            # Eq. 2 with the student as its own reference: this project's reading of L_SCT in Eq. 3 (the
            # authors' distillation code has only L_CD); on by default (sct_weight 1)
            loss_sct = cross_view_kl(self1, self2, online1, online2)
            loss = self.sct_weight * loss_sct + loss_cd  # Eq. 3
            stats["loss_cd"] = float(loss_cd.detach())
        else:
            loss_sct = cross_view_kl(ref1, ref2, online1, online2)  # Eq. 2 (reference: the frozen start, not f_θ)
            loss = loss_sct
        if self.mse_weight > 0:
            p1, p2 = self.projector(view1), self.projector(view2)  # (B, D_ref), not normalised: the teacher's vector
            error1 = (p1 - reference1.detach()).pow(2).sum(-1).mean()
            error2 = (p2 - reference2.detach()).pow(2).sum(-1).mean()
            loss_mse = 0.5 * (error1 + error2)
            loss = loss + self.mse_weight * loss_mse.to(loss.dtype)
            stats["loss_mse"] = float(loss_mse.detach())

        with torch.no_grad():
            # the batch sits after the queue; a queued copy of the same vector (a text seen again) ties, not misses
            positives = (self.queue1.size + torch.arange(b, device=online1.device))[:, None]  # (B, 1)
            hits1 = online1.gather(1, positives).squeeze(1) >= online1.max(-1).values
            hits2 = online2.gather(1, positives).squeeze(1) >= online2.max(-1).values
            accuracy = 0.5 * (hits1.float().mean() + hits2.float().mean())
            stats.update(
                loss=float(loss.detach()),
                loss_sct=float(loss_sct.detach()),
                accuracy=float(accuracy),
                **metrics.embedding_metrics(view1, view2),
            )
        self.queue1.enqueue(r1)
        self.queue2.enqueue(r2)
        return loss.to(view1.dtype), stats
