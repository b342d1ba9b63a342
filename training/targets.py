"""The teacher's embeddings of the training texts, each computed once and kept — across epochs and across runs.

When both views are the text itself (``views = "texts"``), the frozen teacher's output for a text never changes,
so a text seen again needs no second teacher pass: a 6-layer teacher costs about what the 2-layer student's forward
and backward do together. The embeddings are computed the first time a text is asked for, inside the run's time
budget — embedding the whole corpus up front would cost a full pass even when the budget ends before one epoch.

With a ``store`` folder (``embedder train`` passes ``EMBED_CACHE_DIR/teacher-embeddings``) the vectors also
outlive the run: they are kept in ``<store>/<teacher fingerprint>.npz`` (text SHA-256 → float32 vector), read at
the start of the next run of the same teacher and saved with every checkpoint, so a second seed, another objective
or a resumed run pays the teacher only for texts no run embedded before. The fingerprint covers the teacher's
weights, pooling, normalisation, output layer and token limit: a different teacher never reads another's vectors.
A store file is bounded: it keeps at most ``max_stored`` vectors (`STORE_MAX_VECTORS`, 100,000: about 180 MB for a
384-wide teacher), the most recently used ones — the file is kept in order of last use, and a save puts every text
the saving run used last, so what the current run uses is never evicted (when a run alone uses more texts than the
bound, the file holds exactly those). A save reads the file, merges and writes it under a lock beside it, and writes
to a temporary file renamed over the old one: runs sharing the store never lose each other's vectors to a race, and
a reader sees the old file or the new one.

With ``preset`` (a file `write_vectors` wrote; ``TrainConfig.teacher_vectors``) the vectors it holds are the targets of
their texts, whoever computed them — /adapt's student distillation can give a frozen model's embeddings of general
text while the adapted teacher embeds the customer's (the /adapt worker). Preset vectors are never written to the store:
it holds only this teacher's own. `fill` embeds a list of texts up front, longest first so that each batch pads to
texts of like length — the cheapest way to pay for texts known before training starts.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence, Set
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from core.durable import remove_leftovers, replacing
from training.encoder import Encoder

log = logging.getLogger(__name__)

TEACHER_EMBEDDINGS = "teacher-embeddings"  # the store's folder under a cache directory (EMBED_CACHE_DIR)
STORE_MAX_VECTORS = 100_000  # vectors a store file keeps, the most recently used: `sct-tiny`'s texts six times over


def teacher_fingerprint(teacher: Encoder) -> str:
    """SHA-256 (hex, 24 characters) of what decides the teacher's embedding of a text: its weights (the output layer
    included; not BERT's unused pooler head, which a folder without it gets at random on every load), pooling,
    normalisation, token limit and vocabulary size."""
    digest = hashlib.sha256()
    digest.update(f"{teacher.pooling}|{teacher.normalize}|{teacher.max_seq_length}|{len(teacher.tokenizer)}".encode())
    for name, tensor in sorted(teacher.state_dict().items()):
        if "pooler" in name.split("."):  # BERT's pooler head: unused here, and randomly initialised when not saved
            continue
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().float().numpy().tobytes())
    return digest.hexdigest()[:24]


def text_key(text: str) -> str:
    """The key of a text's vector in a store or preset file: the SHA-256 of its UTF-8 bytes."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def read_vectors(path: Path) -> dict[str, torch.Tensor]:
    """A file of `write_vectors`: text SHA-256 → ``(D,)`` float32 vector."""
    with np.load(path, allow_pickle=False) as stored:
        vectors = torch.from_numpy(stored["vectors"].astype(np.float32))
        return dict(zip(stored["keys"].tolist(), vectors, strict=True))


def write_vectors(path: Path, vectors: Mapping[str, torch.Tensor]) -> None:
    """Write ``vectors`` (text SHA-256 → vector) to ``path`` atomically: a reader sees the old file or the new one."""
    if not vectors:
        raise ValueError(f"no vectors to write to {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = list(vectors)
    with replacing(path, mode=0o644) as out:  # shared like the rest of EMBED_CACHE_DIR
        np.savez(out, keys=np.array(keys), vectors=torch.stack([vectors[k] for k in keys]).float().numpy())


class TeacherTargets:
    """``targets(texts)`` → ``(B, D_t)`` the teacher's embeddings of ``texts``; each distinct text is embedded once.

    ``store``: a folder where the vectors persist between runs of the same teacher (None: this run only), at most
    ``max_stored`` of them, the most recently used (see the module's docstring).
    ``preset``: a `write_vectors` file whose vectors are the targets of their texts (never saved to the store).
    """

    def __init__(
        self,
        teacher: Encoder,
        store: Path | None = None,
        preset: Path | None = None,
        *,
        max_stored: int = STORE_MAX_VECTORS,
    ) -> None:
        if max_stored < 1:
            raise ValueError(f"max_stored must be at least 1, got {max_stored}")
        self.teacher = teacher
        self.vectors: dict[str, torch.Tensor] = {}  # text SHA-256 → (D_t,): this teacher's own
        self.preset = read_vectors(Path(preset)) if preset is not None else {}
        self.path = Path(store) / f"{teacher_fingerprint(teacher)}.npz" if store is not None else None
        self.max_stored = max_stored
        self.loaded = 0  # vectors read from the store at the start
        self.computed = 0  # texts this run embedded with the teacher
        self._used: dict[str, None] = {}  # the texts (SHA-256) this run asked for, in order of first use
        self._unsaved = False  # a text embedded, or first used, since the last save
        if self.path is not None:
            self.vectors = _last(_stored(self.path), max_stored)  # a file written before the bound: its newest
            self.loaded = len(self.vectors)

    def __len__(self) -> int:
        return len(self.vectors)

    def _known(self, key: str) -> torch.Tensor | None:
        return self.preset.get(key, self.vectors.get(key))

    def _use(self, keys: Sequence[str]) -> None:
        """Note texts this run uses: the store keeps them as its most recent at the next save."""
        for key in keys:
            if key not in self._used:
                self._used[key] = None
                self._unsaved = True

    @torch.no_grad()
    def _embed(self, missing: Sequence[tuple[str, str]]) -> None:
        new = self.teacher(**self.teacher.tokenize([t for _k, t in missing])).float().cpu()  # (M, D_t)
        self.vectors.update(zip((k for k, _t in missing), new, strict=True))
        self.computed += len(missing)
        self._unsaved = True

    def __call__(self, texts: Sequence[str]) -> torch.Tensor:
        keys = [text_key(t) for t in texts]
        self._use(keys)
        missing = list(dict.fromkeys((k, t) for k, t in zip(keys, texts, strict=True) if self._known(k) is None))
        if missing:
            self._embed(missing)
        device = self.teacher.device
        return torch.stack([self._known(k) for k in keys]).to(device)  # (B, D_t)

    def fill(
        self, texts: Sequence[str], *, batch_size: int = 64, progress: Callable[[int, int], None] | None = None
    ) -> int:
        """Embed every text of ``texts`` that has no vector yet, longest first in batches of ``batch_size``;
        ``progress(done, total)`` after each batch. Returns how many texts the teacher embedded."""
        pending = {text_key(t): t for t in texts}
        self._use(list(pending))
        missing = sorted(((k, t) for k, t in pending.items() if self._known(k) is None), key=lambda kt: -len(kt[1]))
        for start in range(0, len(missing), batch_size):
            self._embed(missing[start : start + batch_size])
            if progress is not None:
                progress(min(start + batch_size, len(missing)), len(missing))
        return len(missing)

    def of(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        """The known vectors of ``texts`` (text SHA-256 → vector), e.g. to `write_vectors` them for another run."""
        return {k: v for k in map(text_key, texts) if (v := self._known(k)) is not None}

    def save(self) -> None:
        """Write the vectors this run used to the store, merged with what other runs saved there and bounded to
        ``max_stored`` (this run's last, so none of them is evicted), under the store file's lock, atomically."""
        if self.path is None or not self._unsaved:
            return
        mine = {key: self.vectors[key] for key in self._used if key in self.vectors}  # not preset ones
        with _locked(self.path):
            remove_leftovers(self.path)  # the copies of saves killed mid-write (no live save: this one holds the lock)
            stored = _stored(self.path)
            others = {key: vector for key, vector in stored.items() if key not in mine}
            write_vectors(self.path, _last({**others, **mine}, max(self.max_stored, len(mine))))
        self._unsaved = False


def _stored(path: Path) -> dict[str, torch.Tensor]:
    """The vectors of the store file ``path``; none when there is none, or when it cannot be read (cut short by a power
    loss, say): a cache costs teacher passes, never the run, and the next save writes it whole again."""
    if not path.is_file():
        return {}
    try:
        return read_vectors(path)
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as err:
        log.warning("teacher embeddings store %s is unreadable (%s): its texts are embedded again", path, err)
        return {}


def _last(vectors: dict[str, torch.Tensor], count: int) -> dict[str, torch.Tensor]:
    """The last ``count`` entries of ``vectors`` (a store file's order: least recently used first)."""
    if len(vectors) <= count:
        return vectors
    return dict(list(vectors.items())[-count:])


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``<store file>.lock`` while a run reads, merges and writes the store file: two runs
    saving together would otherwise both read the old file, and the later write would drop the earlier one's
    vectors. The lock goes with its holder (a killed run holds nothing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f"{path.name}.lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield  # closing the file releases the lock


def pulled_targets(
    targets: TeacherTargets,
    documents: Sequence[str],
    pieces: Sequence[tuple[str, int]],
    weight: float,
    *,
    shared: Set[str] = frozenset(),
    batch_size: int = 64,
) -> dict[str, torch.Tensor]:
    """Targets that place each piece near the document it was cut from (text SHA-256 → vector): the teacher's
    embedding of every document as it is, and of every piece ``(text, index in documents)`` turned toward its
    document's, ``unit(t(piece)) + weight · unit(t(document))`` scaled back to the norm of ``t(piece)``. Distilled, the
    student learns to put a query-shaped piece where the teacher would, moved toward the document that answers it —
    what a short query finding its document asks of it — in the teacher's space, so the documents' own targets and
    every other text's stay the teacher's. A piece in ``shared`` — one whose words another document holds too
    (`training.data.shared_pieces`): it does not say which document it belongs to — keeps the teacher's embedding, as
    ``weight`` 0 gives every piece; a piece equal to a document keeps the document's. The teacher embeds what
    ``targets`` does not hold yet (`TeacherTargets.fill`: longest first, so a batch pads little)."""
    if weight < 0:
        raise ValueError(f"weight must be >= 0, got {weight}")
    targets.fill([*documents, *(text for text, _source in pieces)], batch_size=batch_size)
    vectors = targets.of(documents)
    anchors = {i: torch.nn.functional.normalize(vectors[text_key(doc)], dim=-1) for i, doc in enumerate(documents)}
    for text, source in pieces:
        key = text_key(text)
        if key in vectors:  # a document, or a piece its document gave twice (a first sentence is also a sentence)
            continue
        own = targets.of([text])[key]
        if text in shared:
            vectors[key] = own
            continue
        turned = torch.nn.functional.normalize(own, dim=-1) + weight * anchors[source]
        vectors[key] = turned / turned.norm() * own.norm()
    return vectors
