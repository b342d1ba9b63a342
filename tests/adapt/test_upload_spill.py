"""A multipart upload is parsed from the body already in memory: its file part is never written to a temporary file
(one written by a reader process killed meanwhile would stay under /tmp), even when it is over the corpus limit and
refused, within the framing the body may carry beyond it."""

from __future__ import annotations

import tempfile

import pytest

from adapt_jobs.corpus import CorpusTooLargeError
from adapt_jobs.settings import AdaptSettings
from service.adapt import intake


def _form(data: bytes) -> tuple[str, bytes]:
    boundary = "b0undary"
    body = (
        f"--{boundary}\r\nContent-Disposition: form-data; name=\"base_model\"\r\n\r\nminilm-l6\r\n"
        f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"c.txt\"\r\n"
        "Content-Type: text/plain\r\n\r\n"
    ).encode() + data + f"\r\n--{boundary}--\r\n".encode()
    return f"multipart/form-data; boundary={boundary}", body


def test_a_file_part_over_the_limit_is_never_spilled_to_disk(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = AdaptSettings(dir=tmp_path / "adapt", max_upload_bytes=4096)
    spilled: list[object] = []
    real = tempfile.NamedTemporaryFile

    def counting(*args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        spilled.append(args)
        return real(*args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", counting)
    content_type, body = _form(b"word " * 2000)  # 10,000 bytes: over the limit, within the framing allowed beyond it
    assert len(body) <= settings.max_upload_bytes + intake.UPLOAD_FRAMING_BYTES
    with pytest.raises(CorpusTooLargeError):
        intake.parse_multipart(content_type, body, settings)
    assert spilled == []
