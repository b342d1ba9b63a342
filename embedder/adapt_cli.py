"""`embedder adapt`: submit a corpus to a running server's ``POST /adapt`` and follow the job to its end.

    embedder adapt docs.jsonl --base-model minilm-l6 --name support-docs
    embedder adapt docs.jsonl --base-model minilm-l6 --name support-docs-fast --student sct-tiny
    embedder adapt --job adaptjob-…          # follow a job already queued

The corpus file goes up as the multipart ``file`` (JSONL, JSON, Parquet or text: the server reads it, docs/ADAPT.md).
A job asking for a ``--student`` may first wait for the one-time build of its base student, a job of its own: it is
followed too. Progress goes to stderr (on a terminal the training steps rewrite one line); the final job (JSON) to
stdout with ``--json``. The exit codes are ``EXIT_CODES`` (shown by ``--help``). HTTP only: no torch here.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

TERMINAL = ("succeeded", "failed", "cancelled")
INTERRUPTED = 130  # the exit code of a command stopped by Ctrl-C (128 + SIGINT)
OVERTAKEN = 4  # gate passed, yet a newer version of the name was promoted meanwhile and stays served
EXIT_CODES = """exit codes:
  0    the job succeeded and its model was promoted (or --promote never; with --no-follow: it was queued)
  1    the job failed or was cancelled, or the server refused, could not be reached or answered no job
  2    bad arguments (also an unreadable corpus, a malformed --job id or --url)
  3    the job succeeded but the gate kept its model from being promoted (the reasons are printed)
  4    the job succeeded and its gate passed, but a newer version of the name, promoted meanwhile, stays served
  130  interrupted (Ctrl-C): the job keeps running on the server; --job ID follows it again
"""
JOB_ID = re.compile(r"adaptjob-[0-9a-f]{24}")  # the server's job ids (adapt_jobs.jobs.new_job_id)
JOB_FIELDS = ("id", "state", "name")  # what is read of every job the server answers


def default_url() -> str:
    """The server ``--url`` defaults to: ``$EMBED_URL``, else the local one."""
    return os.environ.get("EMBED_URL", "http://127.0.0.1:8080")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="embedder adapt", description="\n\n".join(__doc__.split("\n\n")[:2]), epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument("corpus", nargs="?", type=Path, help="the corpus file (omit with --job)")
    p.add_argument("--job", default=None, help="follow this job instead of submitting one")
    p.add_argument("--base-model", default="minilm-l6", help="the model to adapt (default: minilm-l6)")
    p.add_argument("--name", default=None, help="name the adapted model is published under (required to submit)")
    p.add_argument("--student", default=None, help="publish a compact student instead (sct-tiny, distil-tiny, ...)")
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--time-budget-s", type=float, default=None)
    p.add_argument("--objective", default=None, help="crop-infonce (default), sct or simcse")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--promote", choices=("auto", "never"), default=None)
    p.add_argument("--url", default=default_url(),
                   help="the server (default: $EMBED_URL or http://127.0.0.1:8080)")  # fmt: skip
    p.add_argument("--api-key", default=os.environ.get("EMBED_ADMIN_API_KEY"),
                   help="an admin key (default: $EMBED_ADMIN_API_KEY)")  # fmt: skip
    p.add_argument("--no-follow", action="store_true", help="print the queued job and exit")
    p.add_argument("--json", action="store_true", help="print the final job as JSON on stdout")
    p.add_argument("--serve-timeout-s", type=float, default=120.0,
                   help="after a promotion, wait this long for the server to serve the new version (its registry "
                   "poll, then its engine choice); 0: do not wait")  # fmt: skip
    args = p.parse_args(argv)
    if (args.corpus is None) == (args.job is None):
        p.error("give a corpus file to submit, or --job ID to follow")
    if args.job is not None and not JOB_ID.fullmatch(args.job):
        p.error(f"--job {args.job!r}: not a job id (adaptjob- and 24 hex digits)")
    try:
        url = httpx.URL(args.url)
    except httpx.InvalidURL as err:
        p.error(f"--url {args.url}: {err}")
    if url.scheme not in ("http", "https") or not url.host:
        p.error(f"--url {args.url}: not an http:// or https:// address")
    if args.corpus is not None and not args.name:
        p.error("--name is required to submit a corpus")
    if args.corpus is not None and not args.corpus.is_file():
        p.error(f"{args.corpus}: {'a folder, not a file' if args.corpus.is_dir() else 'no such file'}")
    if args.corpus is not None:
        try:
            args.corpus.open("rb").close()
        except OSError as err:
            p.error(f"cannot read {args.corpus}: {err.strerror or err}")
    return args


def _fail(response: httpx.Response) -> int:
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = response.text
    print(f"embedder adapt: the server answered {response.status_code}: {message}", file=sys.stderr)
    return 1


class NotAJob(Exception):
    """The server answered something other than a job where a job was expected."""


def _excerpt(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def _checked(data: Any, answered: str) -> dict[str, Any]:
    """``data`` when it is a job (its ``JOB_FIELDS`` are strings), else NotAJob naming what was answered."""
    if isinstance(data, dict) and all(isinstance(data.get(key), str) for key in JOB_FIELDS):
        return data
    raise NotAJob(answered)


def _job(response: httpx.Response) -> dict[str, Any]:
    """The job in ``response``'s body (NotAJob when the body is not one)."""
    try:
        data = response.json()
    except ValueError:
        data = None
    return _checked(data, f"the server answered {response.status_code} with something other than a job: "
                          f"{_excerpt(response.text) or '(an empty body)'}")  # fmt: skip


def _path(job_id: str, tail: str = "") -> str:
    return f"/adapt/{quote(job_id, safe='')}{tail}"


def submit(client: httpx.Client, args: argparse.Namespace) -> httpx.Response:
    fields = {
        "base_model": args.base_model, "name": args.name, "student": args.student, "max_steps": args.max_steps,
        "time_budget_s": args.time_budget_s, "objective": args.objective, "seed": args.seed, "promote": args.promote,
    }  # fmt: skip
    data = {k: str(v) for k, v in fields.items() if v is not None}
    with args.corpus.open("rb") as corpus:
        return client.post("/adapt", data=data, files={"file": (args.corpus.name, corpus)})


class _Lines:
    """Progress lines on stderr; on a terminal a run of step lines of one stage rewrites itself in place, as a
    progress bar does, and elsewhere (a log, a pipe) every line stays."""

    def __init__(self) -> None:
        self.in_place = sys.stderr.isatty()
        self.open_stage: str | None = None  # the stage whose step line is being rewritten, not yet ended

    def say(self, text: str, stage: str | None = None) -> None:
        """Print ``text``; ``stage``: the stage of a step line, which the next step of that stage overwrites."""
        if self.open_stage is not None:
            if stage == self.open_stage:
                print(f"\r\033[K{text}", end="", file=sys.stderr, flush=True)
                return
            print(file=sys.stderr)
        self.open_stage = stage if self.in_place else None
        print(text, end="" if self.open_stage is not None else "\n", file=sys.stderr, flush=True)

    def end(self) -> None:
        if self.open_stage is not None:
            print(file=sys.stderr)
            self.open_stage = None


def follow(client: httpx.Client, job_id: str, label: str) -> dict[str, Any]:
    """Print the job's stage changes and training steps (stderr) until it ends; return the final job."""
    shown = None
    lines = _Lines()
    try:
        with client.stream("GET", _path(job_id, "/events"), timeout=None) as events:
            kind = None
            for line in events.iter_lines():
                if line.startswith("event: "):
                    kind = line.removeprefix("event: ")
                    continue
                if not line.startswith("data: "):
                    continue
                data = json.loads(line.removeprefix("data: "))
                if kind == "done":
                    return _checked(data, f"the server ended the events of {job_id} with something other than a "
                                          f"job: {_excerpt(json.dumps(data))}")  # fmt: skip
                if kind == "state":
                    lines.say(f"[{label}] {data['state']}" + (f" ({data['reason']})" if data.get("reason") else ""))
                elif kind == "progress" and data.get("stage"):
                    step = f" {data['step']}/{data.get('total') or '?'}" if data.get("step") else ""
                    detail = f" — {data['detail']}" if data.get("detail") else ""
                    line_out = f"[{label}] {data['stage']}{step}{detail}"
                    if line_out != shown:
                        lines.say(line_out, stage=data["stage"] if step else None)
                        shown = line_out
        return _job(client.get(_path(job_id)))
    finally:
        lines.end()


def summary(job: dict[str, Any]) -> str:
    lines = [f"job {job['id']}: {job['state']}"]
    if job.get("error"):
        lines.append(f"  error ({job['error']['reason']}): {job['error']['message']}")
    evaluation = job.get("evaluation") or {}
    for key in ("in_domain", "pieces", "general", "knn"):
        if evaluation.get(key):
            scores = ", ".join(f"{role} {value:.2f}" for role, value in evaluation[key].items())
            lines.append(f"  {key.replace('_', '-')}: {scores}")
    gate = job.get("gate") or {}
    if gate:
        decided_on = f" (decided on {gate['decided_on']})" if gate.get("decided_on") else ""
        lines.append(f"  gate: {'passed' if gate.get('passed') else 'failed'}{decided_on}")
        lines += [f"    {reason}" for reason in gate.get("reasons") or []]
    if job.get("model"):
        model = job["model"]
        lines.append(f"  model: {model['name']} version {model['version']}, "
                     f"{'promoted' if model['promoted'] else 'not promoted'}")  # fmt: skip
    return "\n".join(lines)


def wait_served(client: httpx.Client, model: dict[str, Any], timeout_s: float) -> dict[str, Any] | None:
    """The server's card of ``model`` (``GET /v1/models/{name}``) once it serves that version, or None when it does
    not within ``timeout_s`` (or answers anything but the card or 404)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            answer = client.get(f"/v1/models/{quote(model['name'], safe='')}")
        except httpx.TransportError:
            return None
        card = answer.json() if answer.status_code == 200 else None
        if card is not None and card.get("version") == model["version"]:
            return card
        if answer.status_code not in (200, 404) or time.monotonic() >= deadline:
            return None
        time.sleep(0.5)


def _interrupted(args: argparse.Namespace, queued: dict[str, Any] | None) -> int:
    """Ctrl-C before the job ended: the job is not cancelled; say how to follow it again."""
    if queued is None:
        print("embedder adapt: interrupted before the server answered; the job may have been queued "
              "(GET /adapt lists the jobs)", file=sys.stderr)  # fmt: skip
        return INTERRUPTED
    again = ["embedder", "adapt", "--job", queued["id"]]
    if args.url != default_url():
        again += ["--url", args.url]
    print(f"embedder adapt: stopped following; job {queued['id']} keeps running on the server "
          f"(follow it again: {shlex.join(again)})", file=sys.stderr)  # fmt: skip
    return INTERRUPTED


def run(client: httpx.Client, args: argparse.Namespace) -> int:
    """Submit (or find) the job, follow it and its student build, print the outcome; the exit code."""
    queued: dict[str, Any] | None = None
    try:
        if args.job is not None:
            found = client.get(_path(args.job))
            if found.status_code != 200:
                return _fail(found)
            queued = _job(found)
        else:
            try:
                answer = submit(client, args)
            except OSError as err:  # the file changed since the arguments were checked
                print(f"embedder adapt: cannot read {args.corpus}: {err.strerror or err}", file=sys.stderr)
                return 2
            if answer.status_code != 202:
                return _fail(answer)
            queued = _job(answer)
            print(f"queued {queued['id']}", file=sys.stderr)
        if args.no_follow:
            print(json.dumps(queued, indent=2))
            return 0
        if queued.get("after_job"):
            print(f"waiting for {queued['after_job']}, the one-time build of the base student", file=sys.stderr)
            print(summary(follow(client, queued["after_job"], "student build")), file=sys.stderr)
        job = follow(client, queued["id"], queued["name"])
    except httpx.TransportError as err:
        print(f"embedder adapt: cannot reach {client.base_url}: {err}", file=sys.stderr)
        return 1
    except NotAJob as err:
        print(f"embedder adapt: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return _interrupted(args, queued)
    print(summary(job), file=sys.stderr)
    model = job.get("model") or {}
    if job["state"] == "succeeded" and model.get("promoted") and args.serve_timeout_s > 0:
        try:
            card = wait_served(client, model, args.serve_timeout_s)
        except KeyboardInterrupt:
            print(f"embedder adapt: stopped waiting for {model['name']} version {model['version']} to be served",
                  file=sys.stderr)  # fmt: skip
            return INTERRUPTED
        print(f"  served: {model['name']} version {model['version']} on {card['engine']} ({card['quantization']})"
              if card else f"  not served by {client.base_url} after {args.serve_timeout_s:g} s: it loads what the "
              "registry promotes on its next poll (registry_poll_seconds)", file=sys.stderr)  # fmt: skip
    if args.json:
        print(json.dumps(job, indent=2))
    if job["state"] != "succeeded":
        return 1
    if model.get("promoted") or args.promote == "never":
        return 0
    if (job.get("gate") or {}).get("passed"):
        print(f"  not promoted: a newer version of {model.get('name', job['name'])} was promoted meanwhile and "
              "stays served", file=sys.stderr)  # fmt: skip
        return OVERTAKEN
    return 3


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    with httpx.Client(base_url=args.url, headers=headers, timeout=60) as client:
        return run(client, args)
