"""The fixed probe set that every export is checked on (parity of ONNX against torch).

The texts are composed here from short hand-written fragments, so no third-party text is
shipped. They cover what breaks exports: one-word and empty-ish inputs, punctuation and digits,
code, non-ASCII scripts (accents, CJK, Cyrillic, Greek, Arabic, emoji), and texts long enough to
be cut at ``max_seq_length`` — the case where a position-embedding or mask bug shows.

Every graph is held against torch on them in two batchings (`core.runtime.probe_outputs`): length-sorted batches,
with little padding, and mixed batches, as a server's batch holds texts of any length — where a short text is padded
to a long one's length. An fp32 graph gives the same vector either way (the mask keeps padding out of attention and
pooling); onnxruntime's dynamic int8 does not: it quantises each activation with one scale over the whole batch,
padded positions included, so a short text padded far comes out differently. On minilm-l6 (AMD EPYC, AVX-512 VNNI)
the first preset's int8 graph kept min cosine 0.975 to torch in sorted batches and 0.960 in mixed ones ("ok" padded
to 256 tokens), under the 0.97 bar.
"""

from __future__ import annotations

SUBJECTS = (
    "The committee",
    "A small robot",
    "My neighbour's cat",
    "The new library",
    "An old fisherman",
    "The weather service",
    "Our build server",
    "A retired teacher",
)
ACTIONS = (
    "approved the budget for next year",
    "crossed the river before sunrise",
    "refused to eat anything but fish",
    "opened its doors to the public on Tuesday",
    "repaired the net with a borrowed needle",
    "warned of heavy rain in the north",
    "failed twice while compiling the release",
    "started writing a book about tides",
)
NON_ASCII = (
    "Ünïcödé façade — naïve café, crème brûlée.",
    "東京の天気は晴れです。",
    "Москва — столица России.",
    "Η γλώσσα είναι ελληνική.",
    "مرحبا بالعالم",
    "Emoji test 🙂🚀🌍 with text around it.",
    "Ça coûte 12,50 € ou £10.",
    "Straße, Größe, Fußgänger.",
    "北京欢迎你，上海也欢迎你。",
    "Привет, как дела? Всё хорошо.",
)
ODD = (
    "ok",
    "a",
    "?",
    "1234567890",
    "Short.",
    "WHAT IS THIS ALL-CAPS HEADLINE ABOUT?",
    "def add(a, b):\n    return a + b",
    "email: someone@example.org, url: https://example.org/path?q=1",
    "   leading and trailing spaces   ",
    "tab\tseparated\tvalues\tin\tone\tline",
    "x" * 300,
    "word " * 5,
)
LONG_UNIT = (
    "Transformers encode text into vectors, and pooling turns the token states into one embedding "
    "that can be compared with a cosine. "
)


def probe_texts() -> list[str]:
    """At least 64 varied texts, in a fixed order (short, sentences, non-ASCII, odd, long).

    Long texts run to several hundred words, so every model's ``max_seq_length`` (128–512) cuts them.
    """
    sentences = [f"{s} {a}." for s, a in zip(SUBJECTS, ACTIONS, strict=True)]
    sentences += [f"{s} {a}." for s, a in zip(SUBJECTS, reversed(ACTIONS), strict=True)]
    questions = [f"Why did {s.lower()} {a.split(' ', 1)[1]}?" for s, a in zip(SUBJECTS, ACTIONS, strict=True)]
    medium = [" ".join(sentences[i : i + 4]) for i in range(0, 16, 4)]
    mixed = [f"{sentences[i]} {NON_ASCII[i % len(NON_ASCII)]}" for i in range(6)]
    compound = [f"{sentences[i]} Meanwhile, {sentences[15 - i][0].lower()}{sentences[15 - i][1:]}" for i in range(6)]
    long_texts = [LONG_UNIT * n for n in (6, 12, 40)]
    long_texts += [" ".join(sentences) * 3, " ".join(NON_ASCII) * 8, ("naïve café " * 200).strip()]
    texts = sentences + questions + medium + list(NON_ASCII) + mixed + compound + list(ODD) + long_texts
    return texts
